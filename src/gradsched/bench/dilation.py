"""Time dilation: the emulated cluster run K times slower, its times reported divided by K.

On a small host the emulation competes with itself: the ranks, gloo's threads and the
kernel's work for every emulated link share the host's CPUs, and a setting that keeps them
near 100% measures the host, not the schedule. Dilating by K gives every replayed layer K
times its profiled time, every link 1/K of its rate, and every added latency K times its
delay, so the run is the same schedule with K times longer gaps between the same CPU work;
every time measured (iterations, compute and communication alone, per-message costs, the
runtime's own predictions and trials) is then divided by K before it is reported.

What dilation does not scale: the CPU time of each message, of Python and of the runtime's
hooks (their share of an iteration shrinks by K: that is the point), TCP's own timers
(retransmission, delayed acknowledgements) and the casts of compressed messages. A dilated
figure is therefore what the schedule achieves on a host K times faster than this one.
Only replayed models dilate: real ones compute at the CPU's own speed.

``--dilation auto`` judges the host by what the dilated runs themselves keep busy. It first
runs communication alone once, undilated, at the fastest link of the setting, and starts from
the smallest whole K at which the host's CPUs would be at most :data:`AUTO_CPU_SHARE` busy
(taking the busy share to fall as 1/K). Communication alone is the lightest load the policies
put on the host, so it then runs the setting's own runs for a few iterations at that K, and
while the busiest of them keeps the host over :data:`AUTO_RUN_SHARE` it raises K in proportion
(at most twice more): judged by communication alone, ResNet-50 batch 64 at its balance point
got K=2, where the policies' runs kept the host 47-75% busy (docs/bench.md).
"""

from __future__ import annotations

import math

AUTO_CPU_SHARE = 0.35  # what --dilation auto keeps the host's CPUs under while communicating only
AUTO_RUN_SHARE = 0.45  # ... and the busiest of the dilated runs themselves
AUTO_RAISES = 2  # how many times the runs may raise K
MAX_DILATION = 20.0


def check_dilation(dilation: float | str, replay: bool) -> None:
    """Raise ValueError for a dilation the bench cannot run."""
    if dilation == "auto":
        if not replay:
            raise ValueError("--dilation auto needs a replayed model (replay-*): real models cannot be slowed down")
        return
    if isinstance(dilation, bool) or not isinstance(dilation, (int, float)) or not 1 <= dilation <= MAX_DILATION:
        raise ValueError(f"--dilation must be a factor in 1..{MAX_DILATION:g} or 'auto', got {dilation!r}")
    if dilation != 1 and not replay:
        raise ValueError("--dilation needs a replayed model (replay-*): real models compute at the CPU's own speed")


def auto_dilation(cpu_busy_comm: float | None) -> int:
    """The smallest whole K that brings a communication-only round measured ``cpu_busy_comm``
    busy (0..1, undilated) down to :data:`AUTO_CPU_SHARE`."""
    if cpu_busy_comm is None:
        return 1
    return int(min(MAX_DILATION, max(1, math.ceil(cpu_busy_comm / AUTO_CPU_SHARE - 1e-9))))


def raised_dilation(k: float, busiest: float | None) -> int | None:
    """The K to try after runs at ``k`` kept the host ``busiest`` busy at most (0..1), the share
    taken to fall as 1/K; None where ``k`` is enough (or nothing was measured).

    >>> raised_dilation(2, 0.75), raised_dilation(3, 0.4), raised_dilation(20, 0.9)
    (4, None, None)
    """
    if busiest is None or busiest <= AUTO_RUN_SHARE or k >= MAX_DILATION:
        return None
    return int(min(MAX_DILATION, max(k + 1, math.ceil(k * busiest / AUTO_RUN_SHARE - 1e-9))))
