"""Partitioning strategies: whole tensors, or slices of at most a fixed size."""

from __future__ import annotations

from .base import Partitioner, require
from .task import CommTask


class WholeTensors(Partitioner):
    """Every tensor is one leaf (DDP never splits a tensor)."""

    def split(self, root: CommTask, next_id: int) -> list[CommTask]:
        return [root]


class FixedSize(Partitioner):
    """Slices of at most ``max_bytes`` (element aligned; the last slice may be smaller).

    Slices of one tensor keep its priority and are ordered by their index, so they stay
    contiguous in the priority order and a more urgent tensor's slices can overtake the
    queued remainder of a less urgent one.
    """

    def __init__(self, max_bytes: int) -> None:
        require(max_bytes >= 1, f"partition size must be >= 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes

    def split(self, root: CommTask, next_id: int) -> list[CommTask]:
        return root.partition(self.max_bytes, next_id=next_id)
