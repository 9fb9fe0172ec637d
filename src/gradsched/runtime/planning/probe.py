"""Measuring the link with nothing else in flight: used by the runtime before its measured
trial and by the bench next to every run.

Measurements, each the median of a few repeats, all ranks of ``group`` together: seconds
per byte from a large all-reduce, the time of one tiny all-reduce alone, and the serial
cost per message that pipelining does not hide. That last one is the larger of two: the
time per tiny all-reduce with many in flight at once, and, at a realistic size, what
cutting the large all-reduce into several in flight at once adds per extra message (on
the emulated 3 Gbit/s link: 0.6 ms per tiny message, but about 1.5 ms per 1 MiB slice,
which is what a schedule of many slices pays). Messages timed during training make a poor gauge: they also
wait for the slowest rank to join.

With compression the large all-reduce travels in the wire dtype (gloo on CPU reduces float16
about 40% slower per byte than float32 or bfloat16), and the cast to it and back is timed
too: the simulator's cast cost per wire byte.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from gradsched.core.estimator import MeasuredLink


def median_time(action: Callable[[], object], repeats: int, warmup: int = 1,
                device: torch.device | None = None) -> float:
    """Median wall time of ``action`` over ``repeats`` runs after ``warmup`` untimed ones (on
    CUDA, with the device synchronised around each)."""
    cuda = device is not None and device.type == "cuda"

    def timed() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        action()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    return _median_of(timed, repeats, warmup)


def _median_of(timed: Callable[[], float], repeats: int, warmup: int = 1) -> float:
    """The median of what ``timed`` measures (seconds) over ``repeats`` calls after ``warmup``
    uncounted ones (the upper one of an even count)."""
    for _ in range(warmup):
        timed()
    return sorted(timed() for _ in range(repeats))[repeats // 2]


def cast_cost(wire: torch.dtype, device: torch.device | None = None, elements: int = 2 << 20,
              repeats: int = 5) -> float:
    """Seconds per wire byte to cast float32 gradients to ``wire`` in memory already mapped,
    the mean of that cast and the cast back (as :class:`~gradsched.runtime.comm.compression.WireBuffers` casts)."""
    device = device or torch.device("cpu")
    full = torch.linspace(-4.0, 4.0, elements, device=device)  # no random draw: the user's generators stay as they are
    copy = torch.empty(elements, dtype=wire, device=device)
    there = median_time(lambda: copy.copy_(full), repeats, device=device)
    back = median_time(lambda: full.copy_(copy), repeats, device=device)
    return (there + back) / 2 / (elements * copy.element_size())


def probe_link(group: dist.ProcessGroup | None, device: torch.device | None = None, *, large_elements: int = 2 << 20,
               tiny_messages: int = 32, split_messages: int = 8, repeats: int = 5,
               wire: torch.dtype | None = None) -> MeasuredLink:
    """Measure the link among the ranks of ``group``. ``large_elements`` = 0 skips the
    per-byte measurement (``seconds_per_byte`` is then 0) and the split one;
    ``split_messages`` <= 1 skips the split one. With ``wire`` (compression), the
    per-byte and split measurements use that dtype and the cast cost is measured."""
    device = device or torch.device("cpu")
    tiny = [torch.zeros(16, device=device) for _ in range(tiny_messages)]
    per_byte = whole = cast = 0.0
    if wire is not None:
        cast = cast_cost(wire, device, max(large_elements, 1 << 16), repeats)
    if large_elements:
        large = torch.zeros(large_elements, device=device, dtype=wire)
        whole = median_time(lambda: dist.all_reduce(large, group=group), max(3, repeats // 2), device=device)
        per_byte = whole / (large.numel() * large.element_size())
    alone = median_time(lambda: dist.all_reduce(tiny[0], group=group), repeats, device=device)
    pipelined = median_time(lambda: _all_at_once(tiny, group), max(3, repeats // 2), device=device) / len(tiny)
    if large_elements and split_messages > 1:
        parts = list(large.chunk(split_messages))
        split = median_time(lambda: _all_at_once(parts, group), max(3, repeats // 2), device=device)
        pipelined = max(pipelined, (split - whole) / (len(parts) - 1))
    return MeasuredLink(alone, pipelined, per_byte, cast)


def probe_ring(group: dist.ProcessGroup | None, device: torch.device | None = None, *, nbytes: int = 4 << 20,
               repeats: int = 3) -> float:
    """Seconds this rank takes to send ``nbytes`` to the next rank of ``group`` (rank + 1, the
    last to rank 0) and hear back that they arrived: the median of ``repeats`` after one
    warm-up. The ranks take turns round the ring (rank 0 first, every other once the rank
    before has sent it its own), so each transfer has the two links it crosses to itself and
    times them alone (gradsched.control.ranks.slow_link names a rank whose link is slow)."""
    device = device or torch.device("cpu")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    after, before = (rank + 1) % size, (rank - 1) % size
    payload = torch.zeros(max(1, nbytes // 4), device=device)
    received = torch.empty_like(payload)
    ack = torch.zeros(1, device=device)

    def settle() -> None:  # on CUDA the host waits for what was queued (NCCL's send and recv return at once)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def pass_on() -> None:  # take the transfer from the rank before, and say it arrived
        dist.recv(received, group_src=before, group=group)
        dist.send(ack, group_dst=before, group=group)

    def turn() -> float:
        if rank != 0:
            pass_on()
        settle()
        start = time.perf_counter()
        dist.send(payload, group_dst=after, group=group)
        dist.recv(ack, group_src=after, group=group)
        settle()
        took = time.perf_counter() - start
        if rank == 0:
            pass_on()
        return took

    return _median_of(turn, repeats)


def _all_at_once(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    for work in [dist.all_reduce(t, group=group, async_op=True) for t in tensors]:
        work.wait()
