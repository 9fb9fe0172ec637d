"""What scheduling bought: the communication time the training thread was exposed to.

Every wait of the training thread for a reduction (a module's forward pre-hook waiting for its
parameters, ``step()`` or ``synchronize()``, a read of a gradient still on the wire, clipping)
goes through :meth:`gradsched.runtime.comm.exchange.Exchange.wait_reduced`, which adds the time
it blocked to one counter. Here that counter is read at the start of each forward pass that
trains (one iteration: forward start to the next training forward's start, micro-steps of
gradient accumulation included), and the latest iterations are kept: two clock reads and a
subtraction per iteration, cheap enough to leave on.

>>> e = Exposure(window=3)
>>> for now, waited in [(0.0, 0.0), (1.0, 0.1), (2.0, 0.3), (3.0, 0.35)]:
...     e.iteration_began(now, waited)
>>> e.summary()
(1.0, 0.1, 0.1)
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from typing import Any

logger = logging.getLogger("gradsched")


class Exposure:
    def __init__(self, window: int = 20) -> None:
        self._latest: tuple[float, float] | None = None  # (clock, waited) at the latest iteration's start
        self.iterations: deque[tuple[float, float]] = deque(maxlen=window)  # (iteration s, exposed s)
        self.count = 0  # iterations begun

    def iteration_began(self, now: float, waited_s: float) -> None:
        self.count += 1
        if self._latest is not None:
            began, waited = self._latest
            self.iterations.append((now - began, waited_s - waited))
        self._latest = (now, waited_s)

    def summary(self) -> tuple[float, float, float] | None:
        """(iteration s, exposed s, exposed share): medians over the latest iterations, or None."""
        if not self.iterations:
            return None
        iteration = statistics.median(t for t, _ in self.iterations)
        exposed = statistics.median(w for _, w in self.iterations)
        return iteration, exposed, statistics.median(w / t if t > 0 else 0.0 for t, w in self.iterations)


def say_exposure(exposure: Exposure, policy: str, trial: Any) -> None:
    """What scheduling bought, at INFO on the ``gradsched`` logger (rank 0 says it every 50
    iterations); ``trial``: the measured trial's report, or None."""
    summary = exposure.summary()
    if summary is None or not logger.isEnabledFor(logging.INFO):
        return
    iteration, exposed, share = summary
    gain = f"; measured trial: the policy {trial.fifo_s / trial.policy_s - 1:+.0%} against DDP-style buckets" \
        if trial is not None and trial.policy_s else ""
    logger.info("gradsched: %s, latest iterations: %.2f ms each, %.2f ms (%.0f%%) waiting for communication%s",
                policy, iteration * 1e3, exposed * 1e3, share * 100, gain)
