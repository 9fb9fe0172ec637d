"""The simulated cluster and the physical limit (DESIGN.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.architectures import NAMES, Kind, kind
from ..units import format_bandwidth, format_duration

ARCHITECTURES = NAMES  # the one list (gradsched.core.architectures)


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

    def comm_time(self, nbytes: float) -> float:
        """Time to move ``nbytes`` of gradients once at link speed (no latency)."""
        return nbytes * self.seconds_per_byte

    def describe(self) -> str:
        arch = f"{self.arch} ({self.num_servers} servers)" if self.kind.servers else self.arch
        overhead = f" · overhead {format_duration(self.overhead_s)}/message" if self.overhead_s else ""
        cast = f" · cast {self.cast_s_per_byte * 1e9:.3g} ns/byte" if self.cast_s_per_byte else ""
        return (
            f"{self.workers} workers · {arch} · {format_bandwidth(self.bandwidth_bps)} · "
            f"latency {format_duration(self.latency_s)}{overhead}{cast}"
        )
