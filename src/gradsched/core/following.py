"""Following a plan: when each message of one round may start, and what its end reduces.

Every rank follows the same :class:`~gradsched.core.plan.Plan` with its own timing. The rule
(:mod:`gradsched.core.plan`): message k starts once every earlier message has started, the
gradients it carries are ready on this rank, and the event that released it in the plan has
happened here too (a gradient became ready, an earlier message finished or, with parameter
servers, was sent). A :class:`RoundFollower` holds one round's progress under that rule; the
runtime's launcher (:mod:`gradsched.runtime.comm.launcher`) feeds it what happens and
launches what it allows, and tests replay exact event sequences through it. It knows
gradients by their index in the model's parameter list, and which are ready only through
the ``ready`` predicate it is asked with.

>>> plan = Plan("priority", True, (
...     PlannedMessage((("w1", 0, 10),), 40, "w1", None, 0.0, 1.0),
...     PlannedMessage((("w0", 0, 10),), 40, None, 0, 1.0, 2.0)), span_s=2.0)
>>> round_ = RoundFollower(plan, {"w0": 0, "w1": 1})
>>> ready = {1}
>>> round_.launchable(ready.__contains__), round_.launch()
(True, (0, True))
>>> ready.add(0)
>>> round_.launchable(ready.__contains__)  # w0 is ready, but message 0 has not finished
False
>>> round_.finish(0), round_.launchable(ready.__contains__)
([1], True)
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping

from .plan import Plan, PlannedMessage

Ready = Callable[[int], bool]  # whether gradient i of this round has been handed over here (once so, always)


class RoundFollower:
    """Launch and completion progress of one round (one backward pass) on one rank."""

    def __init__(self, plan: Plan, index: Mapping[str, int]) -> None:
        self.plan = plan
        self.messages_of: dict[int, list[int]] = {}  # tensor -> messages carrying a slice of it
        self._slices: dict[int, int] = {}  # tensor -> its slices in the plan
        self._needs: list[tuple[int, ...]] = []  # message -> tensors that must be ready first
        self._carried: list[tuple[int, ...]] = []  # message -> tensor of each of its slices
        for k, message in enumerate(plan.messages):
            carried = [index[name] for name in message.tensors]
            self._carried.append(tuple(carried))
            for i in carried:
                self._slices[i] = self._slices.get(i, 0) + 1
                self.messages_of.setdefault(i, []).append(k)
            after = [index[message.after_tensor]] if message.after_tensor is not None else []
            self._needs.append(tuple(dict.fromkeys(carried + after)))
        self._begin()

    def _begin(self) -> None:
        n = len(self.plan.messages)
        self.launched = 0  # messages started (always a prefix of the plan)
        self.in_flight = 0  # started, not finished
        self.done = [False] * n
        self.resolved = [False] * n  # its results are in place (on CUDA: ordered behind an event)
        self.sent = [False] * n  # reported sent by the transport (parameter servers)
        self.remaining = dict(self._slices)  # tensor -> slices not yet reduced
        self._ready_needs = 0  # how many of the next message's needs are known ready (a prefix)

    def again(self) -> RoundFollower:
        """A follower of another round of the same plan, from its start (what only the plan
        decides is shared, not worked out again)."""
        follower = copy.copy(self)
        follower._begin()
        return follower

    @property
    def next(self) -> PlannedMessage | None:
        """The message to start next (None: every message has started)."""
        return self.plan.messages[self.launched] if self.launched < len(self.plan.messages) else None

    @property
    def complete(self) -> bool:
        """Every message has finished."""
        return self.launched == len(self.plan.messages) and self.in_flight == 0

    def _first_lacking(self, ready: Ready) -> int:
        """Where in the next message's needs the first gradient not ready is (their number:
        none). A gradient once ready stays ready for the round, so the search goes on from
        where it last stopped: following a round asks ``ready`` about each need about once,
        however often it is asked whether the next message may start."""
        needs = self._needs[self.launched]
        k = self._ready_needs
        while k < len(needs) and ready(needs[k]):
            k += 1
        self._ready_needs = k
        return k

    def lacking(self, ready: Ready) -> list[int]:
        """The gradients the next message waits for (its own, and its releasing one)."""
        if self.next is None:
            return []
        needs = self._needs[self.launched]
        return [i for i in needs[self._first_lacking(ready):] if not ready(i)]

    def launchable(self, ready: Ready) -> bool:
        """Whether the next message may start now."""
        message = self.next
        if message is None or self._first_lacking(ready) < len(self._needs[self.launched]):
            return False
        after = message.after_message
        return after is None or self.done[after] or (message.after_sent and self.sent[after])

    def launch(self) -> tuple[int, bool]:
        """Start the next message (the caller checked :meth:`launchable`): its index, and
        whether it is the only message of this round in flight."""
        if self.next is None:
            raise ValueError("every message of this round has started")
        k = self.launched
        self.launched += 1
        self._ready_needs = 0
        self.in_flight += 1
        return k, self.in_flight == 1

    def mark_sent(self, k: int) -> None:
        """This rank's part of message ``k`` is sent (its push done)."""
        self._check_started(k)
        self.sent[k] = True

    def resolve(self, k: int) -> list[int]:
        """Message ``k``'s results are in place (a consumer that waits for them sees them),
        though it may not have finished (CUDA: the device may still be running it): the
        gradients whose every slice is now reduced."""
        self._check_started(k)
        if self.resolved[k]:
            raise ValueError(f"message {k} resolved twice")
        self.resolved[k] = True
        reduced = []
        for i in self._carried[k]:  # one entry per slice
            self.remaining[i] -= 1
            if self.remaining[i] == 0:
                reduced.append(i)
        return reduced

    def finish(self, k: int) -> list[int]:
        """Message ``k`` finished (its credit is free again): the gradients whose every slice
        is now reduced, if it was not resolved before."""
        self._check_started(k)
        if self.done[k]:
            raise ValueError(f"message {k} finished twice")
        reduced = [] if self.resolved[k] else self.resolve(k)
        self.done[k] = True
        self.sent[k] = True
        self.in_flight -= 1
        return reduced

    def carried(self, k: int) -> tuple[int, ...]:
        """The gradient of each slice of message ``k``, in order (a gradient twice if sliced twice)."""
        return self._carried[k]

    def carries_from(self, i: int, k: int) -> bool:
        """Whether message ``k`` or a later one carries a slice of gradient ``i``."""
        return any(m >= k for m in self.messages_of.get(i, ()))

    def _check_started(self, k: int) -> None:
        if not 0 <= k < self.launched:
            raise ValueError(f"message {k} has not started")
