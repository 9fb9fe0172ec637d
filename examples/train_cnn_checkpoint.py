"""A CNN with BatchNorm, gradient clipping and a checkpoint, under gradsched.

    torchrun --nproc_per_node 2 examples/train_cnn_checkpoint.py [--policy prophet] [--steps 40]

Shows the three things that differ from plain DDP code: ``optimizer.synchronize()`` before
clipping (it reads every gradient), ``optimizer.close()`` at the end, and that checkpoints
need nothing special: ``state_dict()`` waits for pending updates, and the optimizer's state
is the ordinary AdamW format.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

import gradsched


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="bytescheduler", choices=["fifo", "priority", "bytescheduler", "prophet"])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(1 + rank)
    images = [torch.randn(16, 3, 32, 32, generator=generator) for _ in range(args.steps)]
    data = [(x, (x[:, :, :4, :4].mean((1, 2, 3)) * 40).long().clamp(-5, 4) + 5) for x in images]  # learnable

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    model, optimizer = gradsched.wrap(model, optimizer, policy=args.policy)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    checkpoint = os.path.join(tempfile.gettempdir(), f"gradsched-example-{os.getpid()}.pt")
    half = args.steps // 2
    for step, (x, y) in enumerate(data, start=1):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.synchronize()  # clipping reads every gradient: wait until all are reduced
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        if step == half and rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, checkpoint)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    optimizer.close()

    # the checkpoint is plain PyTorch: it loads into an unwrapped model and optimizer
    if rank == 0:
        state = torch.load(checkpoint)
        plain = make_model()
        plain.load_state_dict(state["model"])
        plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=2e-3, weight_decay=0.05)
        plain_optimizer.load_state_dict(state["optimizer"])
        steps = int(next(iter(plain_optimizer.state.values()))["step"])
        print(f"checkpoint from step {half} loads into a plain AdamW (its state counts {steps} steps)")
        os.remove(checkpoint)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
