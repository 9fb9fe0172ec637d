"""How an architecture's plans model the link a message travels: what the planner needs of
the architecture, and nothing more.

>>> LinkModel().link(2e-4, 1e-9, 5e-5)
(0.0002, 1e-09, 5e-05)
>>> LinkModel(sim="ps", servers=2, one_direction=True).link(2e-4, 1e-9, 5e-5)
(5e-05, 1e-09, 5e-05)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkModel:
    sim: str = "allreduce"  # the simulator's model of a message's link (gradsched.sim.network)
    servers: int = 0  # parameter servers a message is spread over (0: none)
    probed: bool = False  # the link is probed before the measured trial, whose outcome the simulator predicts
    one_direction: bool = False  # messages are timed from push to pull: plans model one direction of it

    def link(self, latency: float, seconds_per_byte: float, per_message: float) -> tuple[float, float, float]:
        """The link plans are made on, from the estimate of the messages timed so far.

        Timed from push to pull, queued messages finish one direction's time apart (the pushes
        of later messages overlap the pulls of earlier ones), so the queued fit's cost per
        byte and per message are already one direction's; a lone message's fixed time holds
        two latencies and two per-message costs (its push, then its pull)."""
        if self.one_direction:
            return max(0.0, latency / 2 - per_message), seconds_per_byte, per_message
        return latency, seconds_per_byte, per_message
