"""overhead: one rank, ResNet-50: time per iteration and peak memory against DDP."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import POLICIES, judged, row, sync, warm_up


def part_overhead(device: torch.device, quick: bool) -> list[dict]:
    from gradsched.models.cnn import resnet50

    warm_up(device)
    cuda = device.type == "cuda"
    batch, size, iters = (64, 224, 30) if cuda else (4, 32, 6)
    warmup = 3
    if quick:  # on CPU nothing here is judged: the rows only show the part runs
        iters, warmup = (15, 3) if cuda else (2, 1)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    rows = []
    baseline = None
    for name in ("ddp", *POLICIES):
        torch.manual_seed(0)
        module = resnet50().to(device)
        model = TorchDDP(module) if name == "ddp" else gradsched.DistributedDataParallel(module, policy=name)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for i in range(iters + warmup):
            start = time.perf_counter()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        if hasattr(model, "synchronize"):
            model.synchronize()
        seconds = statistics.median(times)
        peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        baseline = baseline or (seconds, peak)
        ratio, memory = seconds / baseline[0], peak / max(baseline[1], 1)
        rows.append(row(f"overhead {name}", judged(device, ratio <= 1.10 and memory <= 1.5) if name != "ddp" else None,
                        f"{seconds * 1e3:.1f} ms per iteration ({ratio:.2f}x DDP)"
                        + (f", peak {peak / 2**20:.0f} MiB ({memory:.2f}x DDP)" if cuda else ""),
                        iteration_s=seconds, max_memory_allocated=peak))
        if hasattr(model, "close"):
            model.close()
        del model, module, optimizer
        if cuda:
            torch.cuda.empty_cache()
    return rows
