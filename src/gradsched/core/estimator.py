"""Online estimate of the link from finished messages.

Each finished message is one sample, of one of two kinds:

* *queued*: launched while another message was in flight. It finished
  ``per_message + bytes * seconds_per_byte`` after its predecessor: the link's throughput
  plus any per-message cost that pipelining does not hide;
* *isolated*: launched onto an idle link. It took ``latency + bytes * isolated_per_byte``
  from launch to finish. (For ring all-reduce ``isolated_per_byte`` equals
  ``seconds_per_byte``; for push-then-pull it is about twice that, as push and pull
  overlap only between messages.)

Both kinds are fitted by weighted least squares with exponential forgetting, so the
estimate follows a drifting link. Sizes are bytes of gradient payload, so
``seconds_per_byte`` already contains the architecture's factor (2(n-1)/n for ring
all-reduce) and callers never need to know it.

>>> est = LinkEstimator()
>>> for size in (1000, 4000, 2000):
...     est.observe(size, 1e-4 + size * 1e-6, isolated=True)
...     est.observe(size, size * 1e-6, isolated=False)
>>> round(est.latency, 9), round(est.seconds_per_byte, 12), round(est.per_message, 9)
(0.0001, 1e-06, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass


class _LineFit:
    """Weighted least squares of d = a + b * x with forgetting factor ``decay``.

    With too little spread in x to separate the two (sizes within about +-40% of each
    other), ``a`` falls back to 0 (queued samples) or the slope to ``fallback_slope``
    (isolated samples), and ``separable`` is False."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.w = self.x = self.xx = self.d = self.xd = 0.0
        self.n = 0

    def add(self, x: float, d: float) -> None:
        k = self.decay
        self.w = k * self.w + 1.0
        self.x = k * self.x + x
        self.xx = k * self.xx + x * x
        self.d = k * self.d + d
        self.xd = k * self.xd + x * d
        self.n += 1

    @property
    def separable(self) -> bool:
        return self.n > 1 and self.w * self.xx - self.x * self.x > 0.15 * self.w * self.xx

    @property
    def mean(self) -> tuple[float, float]:
        """Weighted mean of (x, d)."""
        return (self.x / self.w, self.d / self.w) if self.w else (0.0, 0.0)

    def solve(self, fallback_slope: float | None = None) -> tuple[float, float]:
        """(intercept, slope), both >= 0."""
        if self.n == 0:
            return 0.0, 0.0
        var = self.w * self.xx - self.x * self.x
        if self.separable:
            slope = (self.w * self.xd - self.x * self.d) / var
            intercept = (self.d - slope * self.x) / self.w
            if slope >= 0.0 and intercept >= 0.0:
                return intercept, slope
        if fallback_slope is None:  # through the origin
            return 0.0, (self.xd / self.xx if self.xx > 0 else 0.0)
        return max(0.0, (self.d - fallback_slope * self.x) / self.w), fallback_slope


class LinkEstimator:
    def __init__(self, decay: float = 0.98) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self._queued = _LineFit(decay)
        self._isolated = _LineFit(decay)
        self.per_message = 0.0  # serial cost per message in a pipelined stream
        self.seconds_per_byte = 0.0  # inverse throughput of a pipelined stream
        self.latency = 0.0  # fixed part of a message on an idle link
        self.isolated_per_byte = 0.0

    @property
    def samples(self) -> int:
        return self._queued.n + self._isolated.n

    @property
    def separable(self) -> bool:
        """Queued messages varied enough in size to tell per-message from per-byte cost.
        When they did not, everything was attributed to bytes; ``mean_queued`` gives the
        average (bytes, seconds) to try the other attribution."""
        return self._queued.separable

    @property
    def mean_queued(self) -> tuple[float, float]:
        return self._queued.mean

    @property
    def ready(self) -> bool:
        """At least one message has been observed."""
        return self.samples > 0

    @property
    def bytes_per_second(self) -> float:
        return 1.0 / self.seconds_per_byte if self.seconds_per_byte > 0.0 else float("inf")

    def transfer_time(self, nbytes: float, messages: int = 1) -> float:
        """Link time that ``messages`` messages of ``nbytes`` in all occupy in a stream."""
        return messages * self.per_message + nbytes * self.seconds_per_byte

    def observe(self, nbytes: int, duration: float, isolated: bool) -> None:
        if nbytes <= 0 or duration < 0.0:
            return
        (self._isolated if isolated else self._queued).add(float(nbytes), duration)
        if self._queued.n:
            self.per_message, self.seconds_per_byte = self._queued.solve()
            self.latency, self.isolated_per_byte = self._isolated.solve(fallback_slope=self.seconds_per_byte)
        else:  # only isolated messages so far: the best guess of throughput is theirs
            self.latency, self.isolated_per_byte = self._isolated.solve()
            self.per_message, self.seconds_per_byte = 0.0, self.isolated_per_byte


@dataclass(frozen=True)
class MeasuredLink:
    """A link as probed with real messages among the workers, nothing else in flight.

    >>> link = MeasuredLink(alone_s=1e-4, pipelined_s=2e-5, seconds_per_byte=1e-9)
    >>> link.latency_s, link.overhead_s
    (8e-05, 2e-05)
    """

    alone_s: float  # one tiny message at a time: launch to result
    pipelined_s: float  # per tiny message with many in flight: the serial cost pipelining does not hide
    seconds_per_byte: float  # per byte of payload of a large all-reduce among the workers (0: not measured)
    cast_s_per_byte: float = 0.0  # compression: per wire byte, casting to the wire dtype (and as much back)

    @property
    def overhead_s(self) -> float:
        """Per-message cost that pipelining does not hide (never above a lone message's)."""
        return min(self.pipelined_s, self.alone_s)

    @property
    def latency_s(self) -> float:
        """The rest of a lone message's time: what a window of messages overlaps."""
        return max(0.0, self.alone_s - self.overhead_s)


class CompletionTimer:
    """Turns the launch and finish times of messages that finish in launch order (one FIFO
    link) into :class:`LinkEstimator` samples: a message is *queued* if it was launched
    before its predecessor finished, and then its duration counts from that finish."""

    def __init__(self, estimator: LinkEstimator) -> None:
        self.estimator = estimator
        self._last_finish = float("-inf")

    def finished(self, nbytes: int, launched_at: float, idle_at_launch: bool, now: float) -> None:
        isolated = idle_at_launch or self._last_finish < launched_at
        duration = now - max(launched_at, self._last_finish)
        self.estimator.observe(nbytes, max(duration, 0.0), isolated)
        self._last_finish = now
