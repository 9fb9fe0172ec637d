"""The scheduler engine: a deterministic state machine fed with events.

One engine drives one worker's gradient communication. The caller (the simulator's event
loop, or the runtime's hooks and completion callbacks) reports what happened, with the
time it happened, and the engine answers with the messages to launch now and the tensors
whose communication is complete. It reads no clock and starts no thread.

>>> from gradsched.core import Scheduler, TensorSpec, policy_config
>>> tensors = [TensorSpec("w0", 100, layer=0, priority=0), TensorSpec("w1", 100, layer=1, priority=1)]
>>> engine = Scheduler(tensors, policy_config("priority").build())
>>> engine.begin_iteration(now=0.0)
>>> [m.names for m in engine.on_ready("w1", now=1.0).start]
[['w1']]
>>> engine.on_ready("w0", now=2.0).start   # one partition in flight: w0 waits
[]
>>> d = engine.on_finished(engine.in_flight[0], now=3.0)
>>> d.done, [m.names for m in d.start]
(['w1'], [['w0']])
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

from .base import Policy
from .estimator import CompletionTimer, LinkEstimator
from .task import CommTask, Message, TaskState, TensorSpec


def message_hold(hold_bytes: int | None) -> int | None:
    """What one message may carry of whole gradients (the engine's ``hold_bytes``) under a rank's
    gradient budget ``hold_bytes``: half of it, so that one message in flight and the next one
    filling fit in the budget together, and the link never waits for a backward pass that waits
    for it.

    >>> message_hold(10), message_hold(None)
    (5, None)
    """
    return None if hold_bytes is None else max(1, hold_bytes // 2)


def default_hold(sizes: Sequence[int]) -> int:
    """A sharded rank's gradient budget when none is given (``gradient_budget_mb``): twice the
    largest gradient, one in flight while the next waits.

    >>> default_hold([4, 9, 2])
    18
    """
    return 2 * max(sizes, default=1)


class SchedulerError(RuntimeError):
    """The engine was fed an impossible event sequence (e.g. a tensor ready twice)."""


@dataclass
class Decision:
    """The engine's answer to one event."""

    start: list[Message] = field(default_factory=list)  # launch these now, in this order
    done: list[str] = field(default_factory=list)  # tensors whose communication completed


class Scheduler:
    """Schedules the communication of a fixed set of gradient tensors under one policy.

    Protocol, per iteration: ``begin_iteration(now)`` when the backward pass begins, then
    ``on_ready(tensor, now)`` as each gradient is computed and ``on_finished(message, now)``
    as each launched message completes. Where sending and completing differ (a push to
    parameter servers, then a pull), ``on_sent(message, now)`` may report the first.
    Every call returns a :class:`Decision`. All communication of an iteration must finish
    before the next one begins.
    """

    def __init__(self, tensors: Sequence[TensorSpec], policy: Policy, hold_bytes: int | None = None) -> None:
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names: {dup}")
        if not tensors:
            raise ValueError("a scheduler needs at least one tensor")
        if hold_bytes is not None and hold_bytes < 1:
            raise ValueError(f"hold_bytes must be >= 1 (or None), got {hold_bytes}")
        self.policy = policy
        #: the most bytes of whole gradients one message may carry slices of (None: no bound). Where a
        #: rank holds each gradient until every message carrying it has started (sharding: its local
        #: gradient, read once by the pack), a message's gradients are all held until it starts: the
        #: policy's messages are cut into consecutive ones within this, launched together
        self.hold_bytes = hold_bytes
        self.tensors: dict[str, TensorSpec] = {t.name: t for t in tensors}
        self.estimator = LinkEstimator()
        self._timer = CompletionTimer(self.estimator)
        self.roots: dict[str, CommTask] = {}
        self.leaves: dict[str, list[CommTask]] = {}
        next_id = 0
        for spec in tensors:
            root = CommTask(next_id, spec)
            leaves = policy.partitioner.split(root, next_id + 1)
            next_id += 1 + (len(leaves) if leaves[0] is not root else 0)
            self.roots[spec.name] = root
            self.leaves[spec.name] = leaves
        self.n_leaves = sum(len(v) for v in self.leaves.values())
        self._key = policy.ordering.key
        self._queue: list[tuple[tuple, int, CommTask]] = []
        self._seq = 0
        self._next_message = 0
        self._in_flight: dict[int, Message] = {}
        self.in_flight_bytes = 0
        self._unsent: dict[int, Message] = {}  # in flight and not yet reported sent
        self.unsent_bytes = 0
        self.iteration = -1
        self._ready_at: dict[str, int] = {}  # tensor -> leaves ready before it this iteration (its turn)
        self.ready_leaves = 0
        self.finished_leaves = 0
        policy.flow.setup(self)

    # -- read-only view used by flow-control strategies ---------------------------------
    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def unsent_count(self) -> int:
        return len(self._unsent)

    @property
    def in_flight(self) -> list[Message]:
        """Messages launched and not yet finished, in launch order."""
        return list(self._in_flight.values())

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def backward_done(self) -> bool:
        """Every leaf of this iteration has become ready."""
        return self.ready_leaves == self.n_leaves

    @property
    def iteration_done(self) -> bool:
        return self.finished_leaves == self.n_leaves

    def peek(self) -> CommTask | None:
        return self._queue[0][2] if self._queue else None

    def pop(self) -> CommTask:
        return heapq.heappop(self._queue)[2]

    def requeue(self, tasks: list[CommTask]) -> None:
        """Put popped, unstarted leaves back in the queue at their places."""
        for task in tasks:
            if task.state != TaskState.READY:
                raise SchedulerError(f"cannot requeue {task.name} in state {task.state.name}")
            self._seq += 1
            heapq.heappush(self._queue, (self._key(task), self._seq, task))

    # -- events --------------------------------------------------------------------------
    def begin_iteration(self, now: float) -> None:
        if self.iteration >= 0 and not self.iteration_done:
            raise SchedulerError(
                f"iteration {self.iteration + 1} began while {self.n_leaves - self.finished_leaves} "
                f"leaves of iteration {self.iteration} are unfinished"
            )
        self.iteration += 1
        self.ready_leaves = 0
        self.finished_leaves = 0
        for root in self.roots.values():
            root.reset()
        self.policy.flow.begin_iteration(self, now)

    def on_ready(self, name: str, now: float) -> Decision:
        if self.iteration < 0:
            raise SchedulerError("on_ready before begin_iteration")
        root = self.roots.get(name)
        if root is None:
            raise SchedulerError(f"unknown tensor {name!r}")
        if root.state != TaskState.PENDING:
            raise SchedulerError(f"tensor {name!r} became ready twice in iteration {self.iteration}")
        root.notify_ready()
        self._ready_at[name] = self.ready_leaves
        for leaf in self.leaves[name]:
            self._seq += 1
            heapq.heappush(self._queue, (self._key(leaf), self._seq, leaf))
        self.ready_leaves += len(self.leaves[name])
        self.policy.flow.on_ready(self, root.tensor, now)
        return Decision(start=self._launch(now))

    def on_sent(self, message: Message, now: float) -> Decision:
        """``message`` has been sent (its push is done); its result is still to come."""
        if message.id not in self._in_flight:
            raise SchedulerError(f"message {message.id} is not in flight")
        self._mark_sent(message)
        return Decision(start=self._launch(now) if self.policy.flow.until_sent else [])

    def _mark_sent(self, message: Message) -> None:
        if self._unsent.pop(message.id, None) is not None:
            self.unsent_bytes -= message.nbytes

    def on_finished(self, message: Message, now: float) -> Decision:
        if self._in_flight.pop(message.id, None) is None:
            raise SchedulerError(f"message {message.id} is not in flight")
        self._mark_sent(message)  # finished implies sent, reported or not
        self._timer.finished(message.nbytes, message.launched_at, message.isolated, now)
        self.in_flight_bytes -= message.nbytes
        done = []
        for leaf in message.tasks:
            root = leaf.notify_finish()
            if root is not None:
                done.append(root.tensor.name)
        self.finished_leaves += len(message.tasks)
        self.policy.flow.on_finished(self, message, now)
        return Decision(start=self._launch(now), done=done)

    # -- internals -----------------------------------------------------------------------
    def _launch(self, now: float) -> list[Message]:
        messages: list[Message] = []
        if self.hold_bytes is not None and self._queue:  # the memory rule first: what it starts, select sees
            messages += self._start(self.policy.flow.relieve(self), now)
        return messages + self._start(self.policy.flow.select(self, now), now)

    def _start(self, groups: list[list[CommTask]], now: float) -> list[Message]:
        messages = []
        for group in groups:
            if not group:
                raise SchedulerError(f"{self.policy.name}: selected an empty message")
            limited = self.policy.flow.limited_bytes(self)  # before this message
            nbytes = sum(task.nbytes for task in group)
            if limited > 0 and limited + nbytes > self.policy.flow.window():
                raise SchedulerError(
                    f"{self.policy.name}: {limited + nbytes} bytes in flight exceed its window "
                    f"of {self.policy.flow.window():.0f}"
                )
            for part in self._within_hold(group):
                idle = not self._in_flight
                for task in part:
                    task.start()
                message = Message(self._next_message, tuple(part), self.iteration, now, idle)
                self._next_message += 1
                self._in_flight[message.id] = message
                self.in_flight_bytes += message.nbytes
                self._unsent[message.id] = message
                self.unsent_bytes += message.nbytes
                messages.append(message)
        return messages

    def held_bytes(self) -> int:
        """Bytes of the gradients ready here with a leaf not yet started (all held whole)."""
        return sum(self.tensors[name].nbytes for name in {entry[2].tensor.name for entry in self._queue})

    def oldest_waiting(self) -> list[CommTask]:
        """The queued leaves of the gradient that became ready first of those with any queued, in
        its order (they stay queued; :meth:`take` takes them)."""
        if not self._queue:
            return []
        oldest = min({entry[2].tensor.name for entry in self._queue}, key=self._ready_at.__getitem__)
        return sorted((entry[2] for entry in self._queue if entry[2].tensor.name == oldest), key=lambda t: t.offset)

    def take(self, tasks: list[CommTask]) -> None:
        """Take queued leaves off the queue, wherever they are in it."""
        ids = {task.id for task in tasks}
        self._queue = [entry for entry in self._queue if entry[2].id not in ids]
        heapq.heapify(self._queue)

    def _within_hold(self, group: list[CommTask]) -> list[list[CommTask]]:
        """``group`` cut, in order, into messages each carrying slices of at most ``hold_bytes``
        of whole gradients (at least one leaf each)."""
        if self.hold_bytes is None:
            return [group]
        parts: list[list[CommTask]] = [[]]
        held: set[str] = set()
        held_bytes = 0
        for task in group:
            spec = task.tensor
            if spec.name not in held:
                if parts[-1] and held_bytes + spec.nbytes > self.hold_bytes:
                    parts.append([])
                    held, held_bytes = set(), 0
                held.add(spec.name)
                held_bytes += spec.nbytes
            parts[-1].append(task)
        return parts
