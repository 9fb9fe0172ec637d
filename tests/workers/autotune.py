"""Worker: train with online autotuning on every rank, then the same with DDP over the
workers; rank 0 writes each worker's report (with the largest difference to DDP).

    python -m workers.autotune OUT.json [--servers S] [--derived]

--derived: bytescheduler's own sizes, derived from the link, are the tuner's start (and its
default search space around them).
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--servers", type=int, default=0)
parser.add_argument("--derived", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
STEPS = 3 + 7 * 3 + 4  # profiling, 6 candidates and a confirming arm, then on


def fresh():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    return net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


def train(model, opt) -> None:
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


model, opt = fresh()
ps = {"architecture": "ps", "servers": args.servers} if args.servers else {}
given = {} if args.derived else {
    "autotune_space": {"partition_bytes": "1KiB:64KiB", "credit_bytes": "4KiB:256KiB"},
    "policy_options": {"partition_bytes": "4KiB", "credit_bytes": "16KiB"}}
model, opt = gradsched.wrap(model, opt, "bytescheduler", profile_rounds=2, replan_every=0, trial_rounds=3,
                            autotune=True, autotune_trials=6, autotune_seed=7, fallback=False, **given, **ps)
report = None
if opt is not None:
    train(model, opt)
    opt.synchronize()
    stats = opt.stats.as_dict()
    report = {"autotune": stats["autotune"], "switches": stats["switches"], "plan_policy": stats["plan_policy"],
              "checksum": [float(p.double().sum()) for p in model.parameters()]}
    opt.close()
# the reference: DDP over the workers, same model, data and optimizer (plan switches that
# corrupted gradients the same way on every rank would agree across ranks, not with this)
workers = dist.new_group(list(range(world - args.servers)))  # every rank creates it
if report is not None:
    reference, ref_opt = fresh()
    train(DDP(reference, process_group=workers), ref_opt)
    report["max_abs_diff"] = max((p - q).abs().nan_to_num(float("inf")).max().item() for p, q in zip(model.parameters(), reference.parameters()))
    report["moved"] = max((p - q).abs().nan_to_num(float("inf")).max().item() for p, q in zip(reference.parameters(), fresh()[0].parameters()))
everyone = [None] * world
dist.all_gather_object(everyone, report)
if rank == 0:
    with open(args.out, "w") as f:
        json.dump([r for r in everyone if r is not None], f)
dist.destroy_process_group()
finish()
