"""A training script written for PyTorch DDP, as a user writes it: gradient accumulation
with ``model.no_sync()``, an LR scheduler, AMP's GradScaler, global-norm clipping with
``torch.nn.utils.clip_grad_norm_(model.parameters())``, checkpoints of ``model.state_dict()``
and the final weights saved from ``model.module``. test_drop_in.py runs it as it is, and with
its import of DDP replaced by gradsched's: that one line is the whole switch.

    python -m workers.ddp_script OUT.pt [--clip C] [--clip-value V] [--amp] [--steps N] [--save-at K CKPT] [--resume CKPT]
"""

import argparse
import random
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workers.launch import finish


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def slow_down(model, rank):
    """Each rank sleeps in a different layer's backward, so some gradients are still being
    reduced when the lines after backward() run."""
    rng = random.Random(rank)
    for module in (model.conv, model.fc1, model.fc2, model.head):
        delay = rng.choice([0.0, 0.003, 0.01])
        if delay:
            module.register_full_backward_hook(lambda *a, d=delay: time.sleep(d))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--clip", type=float, default=0.0)
    parser.add_argument("--clip-value", type=float, default=0.0)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--save-at", nargs=2, metavar=("STEP", "CKPT"))
    parser.add_argument("--resume")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    slow_down(model, rank)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, enabled=args.amp)
    first = 0
    if args.resume:
        checkpoint = torch.load(args.resume)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        first = checkpoint["step"]

    g = torch.Generator().manual_seed(100 + rank)
    data = [[(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))
             for _ in range(args.accumulate)] for _ in range(args.steps)]
    for step in range(first, args.steps):
        for k, (x, y) in enumerate(data[step]):
            with model.no_sync() if k < args.accumulate - 1 else nullcontext():
                loss = nn.functional.cross_entropy(model(x), y) / args.accumulate
                scaler.scale(loss).backward()
        if args.clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if args.clip_value:
            torch.nn.utils.clip_grad_value_(model.parameters(), args.clip_value)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        if args.save_at and step + 1 == int(args.save_at[0]) and rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1,
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}, args.save_at[1])
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.barrier()
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
