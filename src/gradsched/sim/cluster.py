"""The simulated cluster and the physical limit (DESIGN.md section 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.architectures import NAMES, Kind, kind
from ..units import format_bandwidth, format_duration

ARCHITECTURES = NAMES  # the one list (gradsched.core.architectures)


@dataclass(frozen=True)
class LinkBursts:
    """A link ``factor`` times slower for ``slow_s`` of every ``period_s`` seconds by the clock
    (another tenant's traffic, which does not wait for training's steps), its slow phases
    starting at ``offset_s`` and every period after (and before) it. Bytes move at the slow
    rate in a slow phase; a message's fixed costs (latency, per-message overhead) stay as
    they are.

    >>> b = LinkBursts(2.0, 0.2, 0.4)
    >>> b.rate_share, b.mean_factor
    (0.75, 1.3333333333333333)
    >>> b.finish(0.1, 0.1)  # half of it slow (0.1-0.2 s, at half the rate), the rest fast
    0.25
    >>> b.finish(0.3, 0.3)  # fast to 0.4, slow to 0.6 (0.1 s of work), fast again
    0.7
    """

    factor: float
    slow_s: float
    period_s: float
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"a link's bursts need a factor > 1 (that many times slower), got {self.factor!r}")
        if not 0 < self.slow_s < self.period_s:
            raise ValueError(f"a link's bursts need 0 < slow < period, got {self.slow_s!r} s of {self.period_s!r} s")
        if not math.isfinite(self.offset_s):
            raise ValueError(f"a link's bursts need a finite offset, got {self.offset_s!r}")

    @property
    def rate_share(self) -> float:
        """The link's rate averaged over the clock, as a share of its fast rate."""
        slow = self.slow_s / self.period_s
        return 1.0 - slow + slow / self.factor

    @property
    def mean_factor(self) -> float:
        """How many times slower the link is on average (seconds per byte over the clock)."""
        return 1.0 / self.rate_share

    def finish(self, start: float, work_s: float) -> float:
        """When ``work_s`` seconds of the fast link's work, begun at ``start``, are done."""
        period, left, t = self.period_s, work_s, start
        base = self.offset_s + math.floor((start - self.offset_s) / period) * period
        while left > 0:
            slow_end, end = base + self.slow_s, base + period
            if t < slow_end:
                can = (slow_end - t) / self.factor
                if left <= can:
                    return t + left * self.factor
                left, t = left - can, slow_end
            if t < end:
                if left <= end - t:
                    return t + left
                left, t = left - (end - t), end
            base = end
        return t

    def describe(self) -> str:
        return f"{self.factor:g}x slower for {format_duration(self.slow_s)} of every {format_duration(self.period_s)}"


@dataclass(frozen=True)
class Cluster:
    """Identical workers, each with one full-duplex link of ``bandwidth_bps`` per direction.

    ``ps`` adds ``servers`` parameter servers (default: as many as workers) with links of the
    same bandwidth, the load spread evenly over them. ``sharded``: every worker owns 1/n of
    each parameter; a message is reduce-scattered in backward and all-gathered after the
    step, each phase (n-1)/n of its bytes, together what an all-reduce moves.

    ``cast_s_per_byte`` models compression's casts (``--compression``): per byte on the wire,
    what a worker spends casting a message to the wire dtype before it sends it (one message
    at a time), and again casting the result back once it arrived. 0: nothing to cast.
    """

    workers: int = 16
    bandwidth_bps: float = 10e9  # bits per second, each direction
    latency_s: float = 50e-6  # per message
    arch: str = "allreduce"
    servers: int = 0  # ps only; 0 = as many as workers
    overhead_s: float = 0.0  # per message, serial: link time no pipelining hides (framework, launch)
    cast_s_per_byte: float = 0.0  # per wire byte, each way: compression's casts (see above)
    bursts: LinkBursts | None = None  # the links slower in bursts by the clock (a ring: its slowest link sets the pace)

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be a whole number >= 1, got {self.workers!r}")
        if not self.bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth_bps!r} bit/s")
        if not self.latency_s >= 0:
            raise ValueError(f"latency must be >= 0, got {self.latency_s!r} s")
        if not self.overhead_s >= 0:
            raise ValueError(f"message overhead must be >= 0, got {self.overhead_s!r} s")
        if not self.cast_s_per_byte >= 0:
            raise ValueError(f"cast cost must be >= 0 s per byte, got {self.cast_s_per_byte!r}")
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}; choose from: {', '.join(ARCHITECTURES)}")
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 0:
            raise ValueError(f"servers must be a whole number >= 0 (0 = one per worker), got {self.servers!r}")
        if self.servers and not self.kind.servers:
            raise ValueError("servers only apply to --arch ps")
        if self.bursts is not None and self.kind.servers:
            raise ValueError("a link slower in bursts is modelled for rings (all-reduce, sharded), not parameter servers")

    @property
    def kind(self) -> Kind:
        """What the architecture is (gradsched.core.architectures)."""
        return kind(self.arch)

    @property
    def num_servers(self) -> int:
        return self.servers or self.workers

    @property
    def seconds_per_byte(self) -> float:
        """Wire time per byte of gradient payload on the busiest link direction.

        Ring all-reduce: each worker sends (and receives) 2(n-1)/n of the payload.
        PS: each worker pushes and pulls the payload once; each server link carries
        n/S of a worker's share, so servers are the bottleneck when S < n.
        """
        per_byte = 8.0 / self.bandwidth_bps
        n = self.workers
        if self.kind.servers:
            return per_byte * max(1.0, n / self.num_servers)
        return per_byte * 2.0 * (n - 1) / n  # sharded: both phases

    @property
    def phase_seconds_per_byte(self) -> float:
        """What one message's wire time is per payload byte: an all-reduce's, a push's; under
        ``sharded`` one phase's (a reduce-scatter's, or an all-gather's), half the all-reduce's."""
        return self.seconds_per_byte / 2 if self.kind.phases else self.seconds_per_byte

    @property
    def mean_factor(self) -> float:
        """How many times slower than ``bandwidth_bps`` the link is averaged over the clock (1 without bursts)."""
        return 1.0 if self.bursts is None else self.bursts.mean_factor

    def comm_time(self, nbytes: float) -> float:
        """Time to move ``nbytes`` of gradients once at link speed (no latency); with bursts, at
        the link's rate averaged over the clock."""
        return nbytes * self.seconds_per_byte * self.mean_factor

    def describe(self) -> str:
        arch = f"{self.arch} ({self.num_servers} servers)" if self.kind.servers else self.arch
        overhead = f" · overhead {format_duration(self.overhead_s)}/message" if self.overhead_s else ""
        cast = f" · cast {self.cast_s_per_byte * 1e9:.3g} ns/byte" if self.cast_s_per_byte else ""
        bursts = f" ({self.bursts.describe()})" if self.bursts is not None else ""
        return (
            f"{self.workers} workers · {arch} · {format_bandwidth(self.bandwidth_bps)}{bursts} · "
            f"latency {format_duration(self.latency_s)}{overhead}{cast}"
        )
