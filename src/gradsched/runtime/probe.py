"""Measuring the link with nothing else in flight: used by the runtime before its measured
trial and by the bench next to every run.

Three measurements, each the median of a few repeats, all ranks of ``group`` together:
seconds per byte from a large all-reduce, the time of one tiny all-reduce alone, and the
time per tiny all-reduce with many in flight at once (the serial cost per message that
pipelining does not hide). Messages timed during training make a poor gauge: they also
wait for the slowest rank to join.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from ..core.estimator import MeasuredLink


def median_time(action: Callable[[], object], repeats: int, warmup: int = 1,
                device: torch.device | None = None) -> float:
    """Median wall time of ``action`` over ``repeats`` runs after ``warmup`` untimed ones (on
    CUDA, with the device synchronised around each)."""
    cuda = device is not None and device.type == "cuda"
    for _ in range(warmup):
        action()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        action()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def probe_link(group: dist.ProcessGroup | None, device: torch.device | None = None, *, large_elements: int = 2 << 20,
               tiny_messages: int = 32, repeats: int = 5) -> MeasuredLink:
    """Measure the link among the ranks of ``group``. ``large_elements`` = 0 skips the
    per-byte measurement (``seconds_per_byte`` is then 0)."""
    device = device or torch.device("cpu")
    tiny = [torch.zeros(16, device=device) for _ in range(tiny_messages)]
    per_byte = 0.0
    if large_elements:
        large = torch.zeros(large_elements, device=device)
        per_byte = median_time(lambda: dist.all_reduce(large, group=group), max(3, repeats // 2), device=device)
        per_byte /= large.numel() * large.element_size()
    alone = median_time(lambda: dist.all_reduce(tiny[0], group=group), repeats, device=device)

    def many() -> None:
        for work in [dist.all_reduce(t, group=group, async_op=True) for t in tiny]:
            work.wait()

    pipelined = median_time(many, max(3, repeats // 2), device=device) / len(tiny)
    return MeasuredLink(alone, pipelined, per_byte)
