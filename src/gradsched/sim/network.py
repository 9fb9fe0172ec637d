"""Network models: how long a message occupies a worker's link, and when it completes.

Default model (documented in docs/simulator.md):

* one link per worker; messages are served in launch order (FIFO) and never preempted;
* a message of ``b`` bytes occupies the link for ``overhead + b * seconds_per_byte`` (bytes
  are serialised at full bandwidth; ``overhead``, 0 by default, is a per-message cost that
  no pipelining hides) and completes ``latency`` after its last byte left. The
  latency of one message overlaps the transfer of the next, as when several collectives
  are in flight, so a window of several messages keeps the link busy where one message
  at a time leaves it idle for ``latency`` after each;
* all-reduce: one operation per message, costing ``latency + 2(n-1)/n * b / B`` alone;
* parameter server: a push on the uplink then, once it completed, a pull on the downlink
  (both directions are separate FIFO links), each costing ``latency + max(1, n/S) * b / B``.

Every worker runs the same schedule, so one representative worker is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster


@dataclass(frozen=True)
class Segment:
    lane: str  # "link", or "push" / "pull"
    start: float  # first byte on the wire
    end: float  # last byte on the wire


@dataclass(frozen=True)
class Transfer:
    segments: tuple[Segment, ...]
    complete: float  # the result is available to the worker


class Network:
    """FIFO links of one worker. ``submit`` returns the whole future of a message at once,
    which is exact because service is FIFO and never preempted."""

    lanes: tuple[str, ...] = ("link",)

    def __init__(self, latency_s: float, seconds_per_byte: float, overhead_s: float = 0.0) -> None:
        self.latency = latency_s
        self.per_byte = seconds_per_byte
        self.overhead = overhead_s
        self.free = {lane: 0.0 for lane in self.lanes}

    def _serve(self, lane: str, nbytes: int, at: float) -> Segment:
        start = max(at, self.free[lane])
        end = start + self.overhead + nbytes * self.per_byte
        self.free[lane] = end
        return Segment(lane, start, end)

    def submit(self, nbytes: int, now: float) -> Transfer:
        seg = self._serve("link", nbytes, now)
        return Transfer((seg,), seg.end + self.latency)


class PushPull(Network):
    lanes = ("push", "pull")

    def submit(self, nbytes: int, now: float) -> Transfer:
        push = self._serve("push", nbytes, now)
        pull = self._serve("pull", nbytes, push.end + self.latency)
        return Transfer((push, pull), pull.end + self.latency)


def make_network(cluster: Cluster) -> Network:
    kind = PushPull if cluster.arch == "ps" else Network
    return kind(cluster.latency_s, cluster.seconds_per_byte, cluster.overhead_s)
