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
* parameter server: a push on the uplink then a pull on the downlink (both directions are
  separate FIFO links), each costing ``latency + max(1, n/S) * b / B``. Servers answer in
  pieces (:data:`gradsched.core.plan.PS_PIECE_BYTES` per server), so a pull starts one
  latency after the first ``lead_bytes`` of its push are in (``S`` pieces), and ends no
  earlier than one latency and one lead after its push;
* compression (a cast cost ``c`` per wire byte): before its first byte leaves, a message is
  cast to the wire dtype, ``c * b``, by one caster that casts one message at a time (it
  overlaps the transfer of earlier messages); once the result arrived it is cast back,
  another ``c * b``, also one message at a time, before it completes;
* a link slower in bursts by the clock (:class:`~gradsched.sim.cluster.LinkBursts`): a
  message's bytes move at the slow rate while a slow phase lasts and at the fast one
  otherwise, however its transfer falls across the phases; its overhead and latency stay.

Every worker runs the same schedule, so one representative worker is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.architectures import kind
from ..core.plan import PS_PIECE_BYTES
from .cluster import Cluster, LinkBursts


@dataclass(frozen=True)
class Segment:
    lane: str  # "link", or "push" / "pull"; "cast" / "cast back" for compression's casts
    start: float  # first byte on the wire (of a cast: its start)
    end: float  # last byte on the wire


@dataclass(frozen=True)
class Transfer:
    segments: tuple[Segment, ...]
    complete: float  # the result is available to the worker


class Network:
    """FIFO links of one worker. ``submit`` returns the whole future of a message at once,
    which is exact because service is FIFO and never preempted."""

    lanes: tuple[str, ...] = ("link",)  # the wire's (casts are not the wire's)

    def __init__(self, latency_s: float, seconds_per_byte: float, overhead_s: float = 0.0,
                 cast_s_per_byte: float = 0.0, bursts: LinkBursts | None = None) -> None:
        self.latency = latency_s
        self.per_byte = seconds_per_byte
        self.overhead = overhead_s
        self.cast = cast_s_per_byte
        self.bursts = bursts
        self.free = {lane: 0.0 for lane in self.lanes}
        self.caster_free = self.back_free = 0.0

    def _cast(self, nbytes: int, at: float) -> tuple[Segment, ...]:
        """The cast to the wire dtype of a message launched at ``at`` (none without compression)."""
        if not self.cast:
            return ()
        start = max(at, self.caster_free)
        self.caster_free = start + nbytes * self.cast
        return (Segment("cast", start, self.caster_free),)

    def _transfer(self, nbytes: int, wire: tuple[Segment, ...], cast: tuple[Segment, ...]) -> Transfer:
        """The message's future: its wire segments first, then its casts; it completes one
        latency after its last byte, and a cast back later."""
        arrived = wire[-1].end + self.latency
        if not cast:
            return Transfer(wire, arrived)
        start = max(arrived, self.back_free)
        self.back_free = start + nbytes * self.cast
        return Transfer(wire + cast + (Segment("cast back", start, self.back_free),), self.back_free)

    def _serve(self, lane: str, nbytes: int, at: float) -> Segment:
        start = max(at, self.free[lane])
        wire = nbytes * self.per_byte
        end = start + self.overhead + wire if self.bursts is None else self.bursts.finish(start + self.overhead, wire)
        self.free[lane] = end
        return Segment(lane, start, end)

    def submit(self, nbytes: int, now: float) -> Transfer:
        cast = self._cast(nbytes, now)
        seg = self._serve("link", nbytes, cast[0].end if cast else now)
        return self._transfer(nbytes, (seg,), cast)


class PushPull(Network):
    """Push, then pull. ``lead_bytes``: what of a message must be pushed before its pull can
    start (None: all of it, as a server that answers whole messages)."""

    lanes = ("push", "pull")

    def __init__(self, latency_s: float, seconds_per_byte: float, overhead_s: float = 0.0,
                 cast_s_per_byte: float = 0.0, lead_bytes: int | None = None) -> None:
        super().__init__(latency_s, seconds_per_byte, overhead_s, cast_s_per_byte)
        self.lead_bytes = lead_bytes

    def submit(self, nbytes: int, now: float) -> Transfer:
        cast = self._cast(nbytes, now)
        push = self._serve("push", nbytes, cast[0].end if cast else now)
        lead = (nbytes if self.lead_bytes is None else min(nbytes, self.lead_bytes)) * self.per_byte
        start = max(push.start + self.overhead + lead + self.latency, self.free["pull"])
        end = max(start + self.overhead + nbytes * self.per_byte, push.end + self.latency + lead)
        self.free["pull"] = end
        return self._transfer(nbytes, (push, Segment("pull", start, end)), cast)


def network_for(arch: str, latency_s: float, seconds_per_byte: float, overhead_s: float = 0.0,
                cast_s_per_byte: float = 0.0, servers: int = 1, bursts: LinkBursts | None = None) -> Network:
    """One worker's links for ``arch``: a FIFO link (slower in ``bursts``, if given), or pushes
    and pulls to ``servers`` servers answering in pieces."""
    if kind(arch).servers:
        if bursts is not None:
            raise ValueError("a link slower in bursts is modelled for rings, not parameter servers")
        return PushPull(latency_s, seconds_per_byte, overhead_s, cast_s_per_byte, lead_bytes=servers * PS_PIECE_BYTES)
    return Network(latency_s, seconds_per_byte, overhead_s, cast_s_per_byte, bursts)


def make_network(cluster: Cluster) -> Network:
    return network_for(cluster.arch, cluster.latency_s, cluster.phase_seconds_per_byte, cluster.overhead_s,
                       cluster.cast_s_per_byte, cluster.num_servers, cluster.bursts)
