"""How busy the host's CPUs were over a stretch of time.

On the emulated cluster every rank, and the kernel's work for every emulated link (copies
through veth, TCP, tc), share one host: a setting whose runs keep the CPUs near 100%
measures the host, not the schedule. The bench reports this figure next to each row.
"""

from __future__ import annotations

from ..extras import require

psutil = require("psutil", "bench")


def _busy_total() -> tuple[float, float]:
    """(busy, total) CPU seconds of all the host's CPUs since boot; waiting for I/O is idle."""
    times = psutil.cpu_times()
    total = sum(times)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class HostCpu:
    """``start()``, ``stop()``, then ``busy``: the fraction of all the host's CPU time that
    was busy in between (0 to 1; None before ``stop`` or over too short a stretch)."""

    def __init__(self) -> None:
        self._start: tuple[float, float] | None = None
        self.busy: float | None = None

    def start(self) -> None:
        self._start = _busy_total()

    def stop(self) -> None:
        busy, total = _busy_total()
        if self._start is not None and total > self._start[1]:
            # the counters are sums of floats: an idle stretch can come out a hair below 0
            self.busy = min(1.0, max(0.0, (busy - self._start[0]) / (total - self._start[1])))
