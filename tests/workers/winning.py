"""Worker: a policy that wins its measured trial against the buckets keeps its own plans,
and still trains as DDP does; rank 0 writes each rank's report.

    python -m workers.winning OUT.json

Six 1024x1024 layers (24 MiB of gradients) whose backward passes each take 10 ms (a
sleep, as a device would compute, leaving the CPU to communication): DDP-style buckets
send almost everything after the last layer, `bytescheduler`'s slices go while the
earlier layers still compute, which on loopback saves most of the all-reduce's time.
"""

import logging
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish_with_report

STEPS = 50  # profiling (3 rounds), the trial's two pairs of 5-round arms, and room for its two extra pairs


def fresh():
    torch.manual_seed(0)
    layers = [nn.Linear(1024, 1024) for _ in range(6)]
    for layer in layers:
        layer.register_full_backward_hook(lambda *args: time.sleep(0.010))
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())])
    return model, torch.optim.SGD(model.parameters(), lr=0.001)


def train(model, opt, rank):
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x = torch.randn(1, 1024, generator=g)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()


logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")  # what it decided
dist.init_process_group("gloo")
rank = dist.get_rank()
model, opt = fresh()
model, opt = gradsched.wrap(model, opt, "bytescheduler", profile_rounds=2, replan_every=0)  # fallback on
train(model, opt, rank)
opt.synchronize()
stats = opt.stats.as_dict()
opt.close()
reference, ref_opt = fresh()
train(DDP(reference), ref_opt, rank)
report = {"plan_policy": stats["plan_policy"], "trial": stats["trial"],
          "max_abs_diff": max((p - q).abs().nan_to_num(float("inf")).max().item() for p, q in zip(model.parameters(), reference.parameters())),
          "moved": max((p - q).abs().nan_to_num(float("inf")).max().item() for p, q in zip(reference.parameters(), fresh()[0].parameters()))}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, report)
finish_with_report(sys.argv[1], everyone)
