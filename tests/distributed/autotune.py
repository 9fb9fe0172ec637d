"""Worker: train with online autotuning on every rank; rank 0 writes each rank's report.

    python autotune.py OUT.json [--servers S]
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch import nn

import gradsched
from launch import finish

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--servers", type=int, default=0)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ps = {"architecture": "ps", "servers": args.servers, "exit_server": False} if args.servers else {}
model, opt = gradsched.wrap(model, opt, "bytescheduler", profile_rounds=2, replan_every=0, trial_rounds=3,
                            autotune=True, autotune_trials=6, autotune_seed=7, fallback=False,
                            autotune_space={"partition_bytes": "1KiB:64KiB", "credit_bytes": "4KiB:256KiB"},
                            policy_options={"partition_bytes": "4KiB", "credit_bytes": "16KiB"}, **ps)
report = None
if opt is not None:
    g = torch.Generator().manual_seed(rank)
    for _ in range(3 + 7 * 3 + 4):  # profiling, 6 candidates and a confirming arm, then on
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.synchronize()
    stats = opt.stats.as_dict()
    report = {"autotune": stats["autotune"], "switches": stats["switches"], "plan_policy": stats["plan_policy"],
              "checksum": [float(p.double().sum()) for p in model.parameters()]}
    opt.close()
everyone = [None] * world
dist.all_gather_object(everyone, report)
if rank == 0:
    with open(args.out, "w") as f:
        json.dump([r for r in everyone if r is not None], f)
dist.destroy_process_group()
finish()
