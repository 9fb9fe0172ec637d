"""Flow control by a credit window, and the queue-draining helper other strategies share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .base import FlowControl, require
from .task import CommTask

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Scheduler
    from .estimator import LinkEstimator

#: A message worth its own launch carries at least this many times the link's per-message
#: cost in bytes' time (the per-message cost is then at most a tenth of its link time).
AMORTISE = 9.0

#: admit(bytes taken so far including the candidate, messages so far including it) -> bool
Admit = Callable[[int, int], bool]


def take_in_order(engine: Scheduler, admit: Admit, fuse_bytes: int = 0, skip: int = 0) -> list[list[CommTask]]:
    """Take leaves off the ready queue in key order while ``admit`` allows, grouping
    consecutive leaves into messages of at most ``fuse_bytes`` (0: one leaf per message).

    Strict by default: it stops at the first leaf that does not fit and never lets a less
    urgent leaf go ahead. ``skip=N`` passes over up to N leaves that do not fit and keeps
    filling with later, smaller ones (the skipped leaves stay queued); only safe where the
    caller knows nothing more urgent can arrive before the taken leaves are through.
    """
    groups: list[list[CommTask]] = []
    skipped: list[CommTask] = []
    current_bytes = 0
    total = 0
    while (task := engine.peek()) is not None:
        size = task.nbytes
        join = bool(groups) and current_bytes + size <= fuse_bytes
        messages = len(groups) + (0 if join else 1)
        if not admit(total + size, messages):
            if len(skipped) >= skip:
                break
            skipped.append(engine.pop())
            continue
        engine.pop()
        if join:
            groups[-1].append(task)
            current_bytes += size
        else:
            groups.append([task])
            current_bytes = size
        total += size
    engine.requeue(skipped)
    return groups


def amortised_bytes(estimate: LinkEstimator, amortise: float) -> int:
    """The smallest message whose link time is at least ``amortise`` times the link's
    per-message cost (0 where the estimate finds no per-message cost or no throughput)."""
    if estimate.seconds_per_byte <= 0.0:
        return 0
    return int(amortise * estimate.per_message / estimate.seconds_per_byte)


def worth_a_message(estimate: LinkEstimator, group: list[CommTask], amortise: float) -> bool:
    """Whether ``group`` moves enough bytes that the link's per-message cost is at most
    1/``amortise`` of its time (always true where the estimate finds no per-message cost)."""
    return estimate.per_message * amortise <= estimate.seconds_per_byte * sum(t.nbytes for t in group)


class CreditWindow(FlowControl):
    """Start queued leaves in order while the bytes in flight stay within ``credit_bytes``.

    A leaf larger than the whole window still starts when nothing else is in flight.
    ``fuse_bytes`` > 0 fuses consecutive leaves into one message up to that size;
    ``max_messages`` also caps how many messages may be in flight at once. With
    ``until_sent`` a message counts only until it is sent (see ``FlowControl.until_sent``).

    ``amortise`` > 0 keeps small messages off a busy link (as Nagle's rule keeps small
    segments off a connection with data outstanding): leaves are fused up to the size whose
    link time is ``amortise`` times the link's per-message cost (the engine's estimate, at
    least ``fuse_bytes``), and a last message smaller than that waits while anything is in
    flight ahead of it. It goes when more leaves fill it, or when the link has nothing else
    to send; until then it costs the link nothing, because the link is busy anyway.
    """

    def __init__(self, credit_bytes: int, fuse_bytes: int = 0, max_messages: int | None = None,
                 until_sent: bool = False, amortise: float = 0.0) -> None:
        require(credit_bytes >= 1, f"credit must be >= 1 byte, got {credit_bytes}")
        require(fuse_bytes >= 0, f"fusion size must be >= 0, got {fuse_bytes}")
        require(max_messages is None or max_messages >= 1, f"max_messages must be >= 1, got {max_messages}")
        require(amortise >= 0.0, f"amortise must be >= 0, got {amortise}")
        self.amortise = amortise
        self.credit_bytes = credit_bytes
        self.fuse_bytes = fuse_bytes
        self.max_messages = max_messages
        self.until_sent = until_sent

    def select(self, engine: Scheduler, now: float) -> list[list[CommTask]]:
        in_flight = self.limited_bytes(engine)
        busy = self.limited_count(engine)
        credit = self.credit_bytes
        slots = float("inf") if self.max_messages is None else self.max_messages - busy

        def admit(total: int, messages: int) -> bool:
            if messages > slots:
                return False
            return in_flight + total <= credit or (busy == 0 and total == engine.peek().nbytes)

        estimate = engine.estimator
        amortise = self.amortise if estimate.ready else 0.0
        fuse = max(self.fuse_bytes, amortised_bytes(estimate, amortise)) if amortise else self.fuse_bytes
        groups = take_in_order(engine, admit, fuse)
        if amortise and groups and (busy or len(groups) > 1) and not worth_a_message(estimate, groups[-1], amortise):
            engine.requeue(groups.pop())  # too small to pay for its message while the link is busy: wait
        return groups

    def window(self) -> float:
        return float(self.credit_bytes)
