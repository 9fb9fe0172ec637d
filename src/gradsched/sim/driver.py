"""Feeds one scheduler engine from the event loop: what the simulator and plan making share.

A gradient becoming ready goes to ``engine.on_ready``; every message the engine launches
is submitted to the network model, whose answer schedules the message's completion as a
:attr:`~gradsched.sim.events.Kind.COMPLETE` event; a completion goes to
``engine.on_finished``, which may launch more. Where the network sends before it
completes (a push, then a pull), the end of the push is a
:attr:`~gradsched.sim.events.Kind.SENT` event for ``engine.on_sent``. Whoever owns the loop decides what else
happens (compute, in the simulator) and is told of every launch with its *cause*: the
tensor whose readiness released it, or the message whose completion did.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..core.engine import Decision, Scheduler
from ..core.task import Message
from .events import EventLoop, Kind
from .network import Network, Transfer


class Launched(NamedTuple):
    """The payload of a COMPLETE event."""

    message: Message
    transfer: Transfer


class Cause(NamedTuple):
    tensor: str | None  # a gradient that became ready
    message: Message | None  # or a message that finished
    sent: bool = False  # ... or only was sent


OnLaunch = Callable[[Launched, Cause], None]


class Driver:
    def __init__(self, engine: Scheduler, network: Network, loop: EventLoop, on_launch: OnLaunch | None = None) -> None:
        self.engine = engine
        self.network = network
        self.loop = loop
        self.on_launch = on_launch

    def ready(self, name: str) -> Decision:
        """Gradient ``name`` became ready now."""
        decision = self.engine.on_ready(name, self.loop.now)
        self._launch(decision.start, Cause(name, None))
        return decision

    def complete(self, launched: Launched) -> Decision:
        """Handle a COMPLETE event: the message finished now."""
        decision = self.engine.on_finished(launched.message, self.loop.now)
        self._launch(decision.start, Cause(None, launched.message))
        return decision

    def sent(self, launched: Launched) -> Decision:
        """Handle a SENT event: the message's push is done now."""
        decision = self.engine.on_sent(launched.message, self.loop.now)
        self._launch(decision.start, Cause(None, launched.message, sent=True))
        return decision

    def _launch(self, messages: list[Message], cause: Cause) -> None:
        now = self.loop.now
        for message in messages:
            launched = Launched(message, self.network.submit(message.nbytes, now))
            push = launched.transfer.segments[0]
            if push.lane == "push":
                self.loop.schedule(push.end, Kind.SENT, launched)
            self.loop.schedule(launched.transfer.complete, Kind.COMPLETE, launched)
            if self.on_launch is not None:
                self.on_launch(launched, cause)
