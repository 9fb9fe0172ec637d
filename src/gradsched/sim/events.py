"""The one event loop of the simulator and of plan making: timed events in a heap.

Events are processed in order of time, then of :class:`Kind` (what happens first when
several things happen at the same instant), then of scheduling: ties never depend on
anything but the order in which events were scheduled, so every run is reproducible.

>>> loop = EventLoop()
>>> loop.schedule(2.0, Kind.READY, "b")
>>> loop.schedule(1.0, Kind.READY, "a")
>>> loop.schedule(2.0, Kind.COMPLETE, "m0")
>>> seen = []
>>> loop.run(lambda event: seen.append((loop.now, event.payload)), until=1.5)
>>> seen, len(loop)
([(1.0, 'a')], 2)
>>> loop.run(lambda event: seen.append((loop.now, event.payload)))
>>> seen
[(1.0, 'a'), (2.0, 'm0'), (2.0, 'b')]
"""

from __future__ import annotations

import enum
import heapq
from typing import Any, Callable, NamedTuple


class Kind(enum.IntEnum):
    """What happens first among events at the same time (smallest first)."""

    SENT = 0  # a message's push is done (parameter servers; its pull is still to come)
    COMPLETE = 1  # a message finished: its credit is free before anything else is decided
    READY = 2  # gradients of a layer became ready
    FORWARD = 3  # a forward pass may begin (after the backward pass before it ended)
    BACKWARD = 4  # a backward pass begins


class Event(NamedTuple):
    time: float
    kind: Kind
    seq: int
    payload: Any


class EventLoop:
    """A heap of events and the current time ``now`` (the time of the latest event taken)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Event] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, at: float, kind: Kind, payload: Any = None) -> None:
        """Add an event at time ``at`` (never before ``now``)."""
        if at < self.now:
            raise ValueError(f"event {kind.name} scheduled at {at} before the current time {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, Event(at, kind, self._seq, payload))

    def peek(self) -> float:
        """Time of the next event (``inf`` when there is none)."""
        return self._heap[0].time if self._heap else float("inf")

    def step(self) -> Event:
        """Take the next event and advance ``now`` to its time."""
        if not self._heap:
            raise IndexError("no event left")
        event = heapq.heappop(self._heap)
        self.now = event.time
        return event

    def run(self, handle: Callable[[Event], None], until: float = float("inf")) -> None:
        """Hand every event up to time ``until`` (inclusive) to ``handle``, in order,
        including events that ``handle`` schedules meanwhile."""
        while self._heap and self._heap[0].time <= until:
            handle(self.step())
