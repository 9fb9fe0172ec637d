"""Training that survives losing a machine: torchrun restarts the job, which resumes from its
last checkpoint and ends exactly where an uninterrupted run ends.

    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint localhost:29400 \
        examples/train_elastic.py --checkpoint /shared/ckpt.pt     # add --servers 1 (and a process) for a server

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives every restart a fresh store: by default
torchrun shares its rendezvous store with the workers' process group, and a restarted gloo
group can read a dead rank's address left from the attempt before and fail to connect
(PyTorch issue 135712; this is about torchrun, not gradsched, and DDP scripts need it too).

When a worker or a parameter server dies (killed, out of memory, its host gone), the other
ranks raise ``GradschedError`` as its connections drop, torchrun stops the rest and starts
every rank again (up to ``--max-restarts`` times), and each rank loads the checkpoint and
continues. Nothing is lost because everything a step depends on is in the checkpoint or a
function of the step number:

- the model, the optimizer, the LR scheduler and the step, saved by rank 0 every
  ``--every`` steps, written to a temporary file and renamed (a rank killed while writing
  leaves the previous checkpoint whole);
- each step's batch, drawn from a generator seeded with (step, rank), so a resumed run sees
  the batches the lost one would have.

The checkpoint path must be reachable from every host (shared storage) on a real cluster.
With ``--out``, rank 0 saves the final parameters (to compare runs).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

import gradsched


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 64, generator=generator)
    return x, x[:, :10].argmax(1)  # a learnable target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint file (shared by every host)")
    parser.add_argument("--policy", default="bytescheduler", choices=["fifo", "priority", "bytescheduler", "prophet"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="steps between checkpoints (default 20)")
    parser.add_argument("--servers", type=int, default=0, help="parameter servers: the last ranks (default 0)")
    parser.add_argument("--out", help="rank 0 saves the final parameters here")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    ps = {"architecture": "ps", "servers": args.servers} if args.servers else {}
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = gradsched.wrap(model, optimizer, policy=args.policy, **ps)
    if optimizer is None:  # a parameter server: it served until the workers closed their optimizers
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start = state["step"]
        if rank == 0:
            restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            print(f"resumed from the checkpoint of step {start} (restart {restarts})", flush=True)
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        if rank == 0 and step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "step": step}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)  # whole, or the previous one
            print(f"step {step} loss {loss.item():.4f} (checkpoint saved)", flush=True)
    optimizer.close()
    if rank == 0 and args.out:
        torch.save(model.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
