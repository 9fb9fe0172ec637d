"""``priority``: partitioning plus strict priority with one partition being sent (P3).

Tensors are cut into slices of ``partition_bytes``; the most urgent ready slice (layers
near the input first) is sent next, one at a time, so an urgent slice waits for at most
one less urgent slice. With all-reduce a slice is being sent until its all-reduce
finishes; with parameter servers only until its push is done, so the push of one slice
overlaps the pulls of those before it, as P3 pipelines them. The next forward of a layer
waits only for that layer's update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import Policy, PolicyConfig, require
from ..credit import CreditWindow
from ..ordering import ByPriority
from ..partitioning import FixedSize

MiB = 1 << 20


@dataclass(frozen=True)
class PriorityConfig(PolicyConfig):
    """Strict priority over slices, one slice being sent at a time."""

    name: ClassVar[str] = "priority"
    partition_bytes: int = 1 * MiB

    def __post_init__(self) -> None:
        require(self.partition_bytes >= 1, f"priority: partition_bytes must be >= 1, got {self.partition_bytes}")

    def build(self) -> Policy:
        flow = CreditWindow(self.partition_bytes, max_messages=1, until_sent=True)
        return Policy(self.name, FixedSize(self.partition_bytes), ByPriority(), flow, cross_barrier=True)
