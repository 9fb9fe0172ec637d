"""end_to_end: one rank, every policy against DDP: autocast with GradScaler (SGD with clipping;
fused AdamW), BatchNorm, an unused parameter, join(), export_profile, and ``device_ids``
moving CPU inputs (world size 1: values here are smoke; the reduction and nccl parts check
reduction)."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from typing import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import POLICIES, TOLERANCE, Net, batches, max_diff, row, state
from gradsched.models.table import ModelTable


def amp_steps(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, device: torch.device,
              clip: float | None, after_backward: Callable[[], None] | None = None) -> None:
    """Train with autocast and GradScaler inside join(); clip after unscale_ if ``clip``."""
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    join = model.join() if hasattr(model, "join") else None
    with join if join is not None else contextlib.nullcontext():
        for x, y in data:
            with torch.autocast(device.type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if after_backward:
                after_backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


def optimizer_for(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "fused-adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def part_end_to_end(device: torch.device, quick: bool) -> list[dict]:
    steps = 6 if quick else 12
    data = batches(device, steps)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, clip in (("sgd", 1.0), ("fused-adamw", None)):
            torch.manual_seed(0)
            initial = Net(unused_for=steps // 2).to(device)
            reference = TorchDDP(copy.deepcopy(initial), find_unused_parameters=True)
            amp_steps(reference, optimizer_for(kind, reference), data, device, clip)
            expected = state(reference)
            for policy in POLICIES:
                model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy,
                                                          find_unused_parameters=True, profile_rounds=2)
                unused: list[bool] = []  # after each backward pass: the unused layer's .grad is None

                def look() -> None:
                    unused.append(model.module.late.weight.grad is None)

                amp_steps(model, optimizer_for(kind, model), data, device, clip, after_backward=look)
                path = model.export_profile(os.path.join(tmp, f"{policy}-{kind}.json"))
                layers = len(ModelTable.load(path).layers)
                diff = max_diff(state(model), expected)
                settled = unused == [True] * (steps // 2) + [False] * (steps - steps // 2)
                rows.append(row(f"end_to_end {policy} {kind}", diff <= TOLERANCE and settled and layers > 0,
                                f"against DDP: max |diff| {diff:.2e}; unused layer's .grad None while unused: "
                                f"{settled}; profile of {layers} layers", max_abs_diff=diff))
                model.close()
    rows.append(_inputs_moved(device))
    return rows


def _inputs_moved(device: torch.device) -> dict:
    """``device_ids=[device]``: CPU inputs (nested in args and kwargs) reach the module on the
    device, as DDP moves them."""
    seen: list[torch.device] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x, pair, extra=None):
            seen.extend(t.device for t in (x, *pair, extra["t"]))
            return self.lin(x)

    ids = [device] if device.type == "cuda" else None
    model = gradsched.DistributedDataParallel(Probe().to(device), device_ids=ids, policy="fifo")
    model(torch.ones(3, 4), (torch.ones(1), torch.ones(1)), extra={"t": torch.ones(1)}).sum().backward()
    model.close()
    ok = all(d.type == device.type for d in seen) and len(seen) == 4
    return row("end_to_end device_ids moves the inputs", ok,
               f"inputs reached the module on {sorted({str(d) for d in seen})}")
