"""The event loop shared by the simulator and plan making: order, ties, run-until."""

from __future__ import annotations

import pytest

from gradsched.sim.events import EventLoop, Kind


def test_events_run_by_time_then_kind_then_scheduling_order():
    loop = EventLoop()
    for at, kind, name in [(1.0, Kind.BACKWARD, "b"), (1.0, Kind.READY, "r1"), (0.5, Kind.FORWARD, "f"),
                           (1.0, Kind.COMPLETE, "c"), (1.0, Kind.READY, "r2")]:
        loop.schedule(at, kind, name)
    seen = []
    loop.run(lambda event: seen.append((loop.now, event.payload)))
    assert seen == [(0.5, "f"), (1.0, "c"), (1.0, "r1"), (1.0, "r2"), (1.0, "b")]


def test_events_scheduled_while_running_are_handled_in_order():
    loop = EventLoop()
    loop.schedule(0.0, Kind.READY, 0)
    seen = []

    def handle(event):
        seen.append((event.time, event.payload))
        if 0 <= event.payload < 3:  # each event schedules the next, and a completion at the same time
            loop.schedule(event.time + 1.0, Kind.READY, event.payload + 1)
            loop.schedule(event.time + 1.0, Kind.COMPLETE, -event.payload - 1)

    loop.run(handle)
    assert seen == [(0.0, 0), (1.0, -1), (1.0, 1), (2.0, -2), (2.0, 2), (3.0, -3), (3.0, 3)]


def test_run_until_stops_after_the_last_event_at_that_time():
    loop = EventLoop()
    for at in (1.0, 2.0, 2.0, 3.0):
        loop.schedule(at, Kind.READY, at)
    seen = []
    loop.run(lambda event: seen.append(event.payload), until=2.0)
    assert seen == [1.0, 2.0, 2.0] and loop.now == 2.0 and loop.peek() == 3.0 and len(loop) == 1
    loop.step()
    assert loop.now == 3.0 and loop.peek() == float("inf")


def test_misuse_is_refused():
    loop = EventLoop(start=5.0)
    with pytest.raises(ValueError, match="before the current time"):
        loop.schedule(4.0, Kind.READY)
    with pytest.raises(IndexError, match="no event"):
        loop.step()
