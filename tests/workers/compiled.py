"""Worker: torch.compile with gradsched against torch.compile with DDP, 2 ranks.

    python -m workers.compiled OUT.json [--backend aot_eager] [--steps N]

For each policy, the model is compiled before the wrap (``gradsched.DistributedDataParallel(
torch.compile(model))``) and after it (``torch.compile(gradsched.DistributedDataParallel(model))``);
each run ends compared with DDP + compile. Rank 0 writes the largest difference per case.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish_with_report
from workers.train_compare import SMALL, Net, batches


def train(model, data) -> list[torch.Tensor]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    data = batches(dist.get_rank(), args.steps)
    torch.manual_seed(0)
    initial = Net()
    torch.manual_seed(0)
    reference = train(torch.compile(DDP(Net()), backend=args.backend), data)
    moved = max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(reference, initial.parameters()))
    report = {"moved": moved, "cases": {}}
    for policy in args.policies.split(","):
        options = dict(policy=policy, policy_options=SMALL[policy], fallback=False, profile_rounds=2, replan_every=2)
        for when in ("before", "after"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            if when == "before":
                model = gradsched.DistributedDataParallel(torch.compile(Net(), backend=args.backend), **options)
                train(model, data)
            else:
                model = gradsched.DistributedDataParallel(Net(), **options)
                train(torch.compile(model, backend=args.backend), data)
            model.synchronize()
            final = [p.detach().clone() for p in model.parameters()]
            model.close()
            report["cases"][f"{policy}/{when}"] = max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(final, reference))
    finish_with_report(args.out, report)


if __name__ == "__main__":
    main()
