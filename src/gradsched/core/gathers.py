"""Which parameter all-gathers a rank issues, in what order and when, under a memory budget
(``architecture="fully_sharded"``): pure decisions, no torch, no threads, shared by the
runtime (:mod:`gradsched.runtime.architectures.sharded.full`) and the simulator.

A *unit* is what one module's forward pass reads: its own parameters, whole. Between uses a
unit is *freed* (every rank holds only its shard); before its module's forward pass and again
before its backward pass it is *gathered*. Every rank issues the same gathers in the same
order: the order is a queue the training thread fills at points every rank passes alike (a
forward pass begins: every freed unit, in the order the previous pass ran them; a forward pass
ends: every freed unit, last-run first, for the backward pass; a unit needed that is neither
whole nor queued), never from local timing. *When* the head of the queue is issued is local:

* ahead of need (prefetch) while the whole units alive, gathered or in flight, stay within
  the budget;
* at once, with everything queued before it, when the training thread needs it (forced):
  the budget bounds prefetching only, so no order of needs can wait on itself.

The gathers go first on the link: a reduce-scatter waits to start while a gather is in flight
or may be issued (:meth:`GatherQueue.holds_reductions`).

After a forward pass a unit is freed unless the backward pass is about to need it: the last
units the previous forward pass ran, as many as fit in the budget beside one unit being
gathered, stay whole (FSDP's ``reshard_after_forward=False`` for exactly those). A unit is
freed once its gradients are all accumulated in the backward pass.

>>> q = GatherQueue([4, 4, 4], budget=8)
>>> q.want([0, 1, 2])
[0, 1, 2]
>>> [q.issue() for _ in range(2)], q.issuable()
([0, 1], False)
>>> q.landed(0); q.landed(1)
>>> q.free(0), q.issuable()
(True, True)
>>> q.need(2), q.issue(), q.materialized
(True, 2, 8)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence


def default_budget(sizes: Sequence[int]) -> int:
    """The budget when none is given: the largest unit, what FSDP2 holds whole at once where
    it has no streams to prefetch on (a host): one layer whole at a time, no prefetch past
    units smaller than the largest, nothing kept from a forward pass for its backward pass.
    A larger ``gather_budget_mb`` buys overlap with memory.

    >>> default_budget([4, 9, 2])
    9
    """
    return max(sizes, default=1)


@dataclass(frozen=True)
class GatherModel:
    """What a rank's gathers are, for plans made beside them: each unit's parameters (their
    gradients' names) and whole bytes, the units in the order the forward pass runs them, and
    the budget of whole parameters."""

    names: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    budget: int


class UnitState(Enum):
    FREED = "freed"  # only this rank's shard
    QUEUED = "queued"  # a gather is queued, not yet issued
    GATHERING = "gathering"  # issued, not yet landed: its memory is allocated
    READY = "ready"  # whole


class GatherQueue:
    def __init__(self, sizes: Sequence[int], budget: int) -> None:
        """``sizes``: each unit's whole bytes; ``budget``: bytes of whole units to hold at most
        by prefetching (a need may exceed it)."""
        if budget <= 0:
            raise ValueError(f"the gather budget must be > 0 bytes, got {budget}")
        self.sizes = list(sizes)
        self.budget = budget
        self.state = [UnitState.FREED] * len(self.sizes)
        self.materialized = 0  # bytes of the units GATHERING or READY
        self._queue: deque[tuple[int, int]] = deque()  # (sequence number, unit)
        self._enqueued = 0  # sequence number of the next item queued
        self._forced = 0  # items numbered below this are issued whatever the budget
        self._position: dict[int, int] = {}  # queued unit -> its sequence number

    # -- the training thread's side -------------------------------------------------------------
    def want(self, units: Iterable[int]) -> list[int]:
        """Queue a gather of each freed unit of ``units``, in that order; those queued."""
        queued = []
        for u in units:
            if self.state[u] is UnitState.FREED:
                self.state[u] = UnitState.QUEUED
                self._position[u] = self._enqueued
                self._queue.append((self._enqueued, u))
                self._enqueued += 1
                queued.append(u)
        return queued

    def need(self, u: int) -> bool:
        """The training thread needs unit ``u`` whole now: queued if freed, and it and every
        gather queued before it issued at once. Whether it must wait (not yet whole)."""
        self.want([u])
        if self.state[u] is UnitState.QUEUED:
            self._forced = max(self._forced, self._position[u] + 1)
        return self.state[u] is not UnitState.READY

    def force_all(self) -> None:
        """Everything queued is issued whatever the budget (a step, ``synchronize()``, the end)."""
        self._forced = self._enqueued

    def keep_after_forward(self, order: Sequence[int]) -> set[int]:
        """The units that stay whole after the forward pass, from the order the previous pass
        ran them (``order``): its last ones, as many as fit in the budget beside the largest
        unit being gathered."""
        room = self.budget - max(self.sizes, default=0)
        kept: set[int] = set()
        for u in reversed(order):
            if u in kept:
                continue
            if self.sizes[u] > room:
                break
            room -= self.sizes[u]
            kept.add(u)
        return kept

    def free(self, u: int) -> bool:
        """Unit ``u`` is no longer needed: whether it was whole (and now is not)."""
        if self.state[u] is not UnitState.READY:
            return False
        self.state[u] = UnitState.FREED
        self.materialized -= self.sizes[u]
        return True

    def whole(self) -> list[int]:
        return [u for u, s in enumerate(self.state) if s is UnitState.READY]

    def settled(self) -> bool:
        """Nothing queued or in flight."""
        return not self._queue and UnitState.GATHERING not in self.state

    def holds_reductions(self) -> bool:
        """Whether a reduce-scatter should wait before it starts: a gather is in flight, or the
        head of the queue may be issued now. The link is the gathers' first: a unit late stalls
        the pass that needs it, a gradient's reduction only the step at the end of the backward
        pass, and the reductions fill the link while no gather can go (a budget reached).

        >>> q = GatherQueue([4, 4], budget=4)
        >>> q.want([0, 1]); q.holds_reductions()  # the head may go
        [0, 1]
        True
        >>> q.issue(); q.holds_reductions()  # in flight
        0
        True
        >>> q.landed(0); q.holds_reductions()  # the next one waits for room: the link is free
        False
        """
        return UnitState.GATHERING in self.state or self.issuable()

    # -- the gathering thread's side ------------------------------------------------------------
    def issuable(self) -> bool:
        """Whether the head of the queue may be issued now."""
        if not self._queue:
            return False
        number, u = self._queue[0]
        return number < self._forced or self.materialized + self.sizes[u] <= self.budget

    def issue(self) -> int:
        """Take the head of the queue: the unit to gather now."""
        _, u = self._queue.popleft()
        del self._position[u]
        self.state[u] = UnitState.GATHERING
        self.materialized += self.sizes[u]
        return u

    def landed(self, u: int) -> None:
        self.state[u] = UnitState.READY
