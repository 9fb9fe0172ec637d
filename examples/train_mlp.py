"""Train a small network on synthetic data with gradsched, on CPU (gloo) or GPU (NCCL).

    torchrun --nproc_per_node 2 examples/train_mlp.py [--policy prophet] [--steps 50] [--trace run.json]
    torchrun --nproc_per_node 4 examples/train_mlp.py --servers 2   # 2 workers + 2 parameter servers (CPU)

Each rank draws its own batches; gradsched averages the gradients like DDP and updates each
layer as soon as its gradients are in, while the next forward pass is already running.
With --servers, the last ranks are parameter servers: they serve inside gradsched.wrap until
the workers close their optimizers, and wrap then returns (model, None); the script ends there.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn

import gradsched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="bytescheduler", choices=["fifo", "priority", "bytescheduler", "prophet"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--trace", default=None, help="write a Chrome trace per rank")
    parser.add_argument("--servers", type=int, default=0, help="parameter servers (the last ranks); CPU only")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    workers = list(range(dist.get_world_size() - args.servers))
    worker_group = dist.new_group(workers) if args.servers else None  # created on every rank
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ps = {"architecture": "ps", "servers": args.servers} if args.servers else {}
    model, optimizer = gradsched.wrap(model, optimizer, policy=args.policy, trace=args.trace, **ps)
    if optimizer is None:  # a parameter server: it served inside wrap until the workers closed their optimizers
        dist.destroy_process_group()
        return
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    generator = torch.Generator(device=device).manual_seed(1 + rank)  # different data per rank
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 256, device=device, generator=generator)
        y = (x[:, :10].argmax(1))  # a learnable target
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    optimizer.synchronize()  # apply the last updates before reading parameters directly
    checksum = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    everyone = [torch.zeros_like(checksum) for _ in workers]
    dist.all_gather(everyone, checksum.to(device) if cuda else checksum, group=worker_group)
    if rank == 0:
        print(f"parameters identical on all workers: {all(torch.equal(c, everyone[0]) for c in everyone)}")
        print(f"gradsched: {optimizer.stats}")
    optimizer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
