"""A fused optimizer under AMP's GradScaler, on every rank: PyTorch's DDP, then gradsched's two
ways in under every policy, each from the same start.

    python -m workers.fused_amp OUT.pt

Fused AdamW unscales inside its own kernel: GradScaler hands it the scale and the overflow
flag as attributes around ``step()``, and a step with an overflow must be skipped. Step 2
overflows for certain (its loss is multiplied by inf on rank 1 only: every rank's reduced
gradients are then inf). Rank r writes ``{run: parameters}`` to OUT.rank{r}.pt.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from workers.launch import finish

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
STEPS = 10
OVERFLOW_AT = 2


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def train(wrapped: nn.Module, optimizer: torch.optim.Optimizer, scaler_of: torch.optim.Optimizer) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x = torch.randn(16, 8, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = wrapped(x).float().pow(2).mean()
        if step == OVERFLOW_AT and dist.get_rank() == 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(scaler_of)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    if scaler.get_scale() >= 2.0**8 * 2 ** (STEPS // 2):
        raise AssertionError("no step overflowed: the scale never backed off")


def run(api: str, policy: str | None) -> dict[str, torch.Tensor]:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, fused=True)
    if api == "torch":
        wrapped, close, scaler_of = TorchDDP(net), (lambda: None), optimizer
    elif api == "ddp":
        wrapped = gradsched.DistributedDataParallel(net, policy=policy, profile_rounds=1, trial_rounds=3)
        close, scaler_of = wrapped.close, optimizer
    else:
        wrapped, scaler_of = gradsched.wrap(net, optimizer, policy, profile_rounds=1, trial_rounds=3)
        close = scaler_of.close
    train(wrapped, optimizer, scaler_of)
    result = {n.removeprefix("module."): p.detach().clone() for n, p in wrapped.state_dict().items()}
    close()
    return result


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {"torch": run("torch", None)}
    for policy in POLICIES:
        for api in ("ddp", "wrap"):
            results[f"{policy}-{api}"] = run(api, policy)
    torch.save(results, f"{sys.argv[1]}.rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
