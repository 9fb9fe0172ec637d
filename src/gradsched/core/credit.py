"""Flow control by a credit window, and the queue-draining helper other strategies share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .base import FlowControl, require
from .task import CommTask

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Scheduler

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


class CreditWindow(FlowControl):
    """Start queued leaves in order while the bytes in flight stay within ``credit_bytes``.

    A leaf larger than the whole window still starts when nothing else is in flight.
    ``fuse_bytes`` > 0 fuses consecutive leaves into one message up to that size;
    ``max_messages`` also caps how many messages may be in flight at once. With
    ``until_sent`` a message counts only until it is sent (see ``FlowControl.until_sent``).
    """

    def __init__(self, credit_bytes: int, fuse_bytes: int = 0, max_messages: int | None = None,
                 until_sent: bool = False) -> None:
        require(credit_bytes >= 1, f"credit must be >= 1 byte, got {credit_bytes}")
        require(fuse_bytes >= 0, f"fusion size must be >= 0, got {fuse_bytes}")
        require(max_messages is None or max_messages >= 1, f"max_messages must be >= 1, got {max_messages}")
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

        return take_in_order(engine, admit, self.fuse_bytes)

    def window(self) -> float:
        return float(self.credit_bytes)
