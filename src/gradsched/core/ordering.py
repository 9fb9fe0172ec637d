"""Ordering strategies: the queue key of a ready leaf (smaller leaves first)."""

from __future__ import annotations

from .base import Ordering
from .task import CommTask


class ByPriority(Ordering):
    """Most urgent first: tensors of layers near the input, then slice order."""

    def key(self, task: CommTask) -> tuple:
        return (task.priority, task.index)


class ReverseForward(Ordering):
    """Reverse forward order, the order in which backward produces gradients and in which
    DDP fills its buckets."""

    def key(self, task: CommTask) -> tuple:
        return (-task.priority, task.index)
