"""The training thread's timestamps, in seconds on ``time.perf_counter``'s clock.

On CPU a stamp is the time it was taken. With CUDA the CPU runs ahead of the device (a
gradient hook runs when autograd queues the kernel, not when it ran), so each stamp also
records a timed event of the device's (:meth:`gradsched.runtime.device.Device.timed_event`) on
the current stream, and :meth:`Clock.resolve` turns a round's stamps
into device times: each event's time after the event of the round's forward start, added to
that start's CPU time. Intervals within a round, and between the starts of rounds
(:meth:`Clock.between`), are then what the device took. Resolving waits for the events, so
it happens only where a rank stops anyway: at control points.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gradsched.runtime.device import Device, HostDevice
from gradsched.runtime.planning.profiling import RoundTiming


class Clock:
    def __init__(self, device: Device | None = None) -> None:
        self.device = device if device is not None else HostDevice()  # the device the gradients live on

    def stamp(self, timing: RoundTiming, key: Any) -> float:
        """The CPU time now; on CUDA also the device's timed event for ``key`` in ``timing``."""
        now = time.perf_counter()
        event = self.device.timed_event()
        if event is not None:
            timing.events[key] = event
        return now

    def resolve(self, timing: RoundTiming) -> RoundTiming:
        """``timing`` with device times (unchanged on CPU, or once resolved)."""
        anchor = timing.events.get("forward_start")
        if anchor is None:
            return timing

        def at(key: Any, cpu: float) -> float:
            event = timing.events.get(key)
            return cpu if event is None else timing.forward_start + self.device.seconds_between(anchor, event)

        return dataclasses.replace(
            timing, forward_end=at("forward_end", timing.forward_end),
            module_starts={n: at(("module", n), t) for n, t in timing.module_starts.items()},
            ready={n: at(("ready", n), t) for n, t in timing.ready.items()}, events={})

    def between(self, first: RoundTiming, second: RoundTiming) -> float:
        """Seconds from ``first``'s forward start to ``second``'s."""
        a, b = first.events.get("forward_start"), second.events.get("forward_start")
        if a is None or b is None:
            return second.forward_start - first.forward_start
        return self.device.seconds_between(a, b)

    def fence(self) -> None:
        """Wait until the device has run everything queued (nothing on CPU): what one measured
        arm queued must not run into the next."""
        self.device.fence()
