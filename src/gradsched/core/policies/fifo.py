"""``fifo``: what PyTorch DDP does, as the baseline every other policy is measured against.

Gradients are fused into buckets filled in reverse forward order (the order backward
produces them): a small first bucket, then buckets of ``bucket_cap_bytes``. A bucket
closes as soon as its size reaches the cap, so it may exceed it by its last tensor; a
tensor is never split. Buckets launch strictly in bucket order, each as soon as all of
its gradients are ready, and the next forward pass waits for ALL communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from ..base import FlowControl, Policy, PolicyConfig, require
from ..ordering import ReverseForward
from ..partitioning import WholeTensors
from ..task import CommTask, TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import Scheduler

MiB = 1 << 20


def assign_buckets(tensors: Sequence[TensorSpec], first_cap: int, cap: int) -> list[list[str]]:
    """Bucket tensor names in the given order (pass them in reverse forward order)."""
    buckets: list[list[str]] = []
    current: list[str] = []
    size = 0
    limit = first_cap
    for spec in tensors:
        current.append(spec.name)
        size += spec.nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets


class InOrderBuckets(FlowControl):
    """Launch each bucket as one message once complete, never before an earlier bucket."""

    def __init__(self, first_cap: int, cap: int) -> None:
        self.first_cap = first_cap
        self.cap = cap
        self.buckets: list[list[str]] = []

    def setup(self, engine: Scheduler) -> None:
        order = sorted(engine.tensors.values(), key=lambda t: -t.priority)
        hold = engine.hold_bytes or self.cap
        self.buckets = assign_buckets(order, min(self.first_cap, hold), min(self.cap, hold))
        self._bucket_of = {name: b for b, names in enumerate(self.buckets) for name in names}

    def begin_iteration(self, engine: Scheduler, now: float) -> None:
        self._missing = [len(b) for b in self.buckets]
        self._next = 0

    def on_ready(self, engine: Scheduler, tensor: TensorSpec, now: float) -> None:
        self._missing[self._bucket_of[tensor.name]] -= 1

    def select(self, engine: Scheduler, now: float) -> list[list[CommTask]]:
        groups = []
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            # Reverse-forward keys put this bucket's tensors at the head of the queue.
            groups.append([engine.pop() for _ in self.buckets[self._next]])
            self._next += 1
        return groups

    def relieve(self, engine: Scheduler) -> list[list[CommTask]]:
        return []  # buckets no larger than the engine's hold_bytes bound what waits

    def window(self) -> float:
        return float("inf")


@dataclass(frozen=True)
class FifoConfig(PolicyConfig):
    """DDP-style buckets, launched in order; the next forward waits for everything."""

    name: ClassVar[str] = "fifo"
    is_buckets: ClassVar[bool] = True
    bucket_cap_bytes: int = 25 * MiB  # DDP's default bucket_cap_mb
    first_bucket_bytes: int = 1 * MiB  # DDP's smaller first bucket

    def __post_init__(self) -> None:
        require(self.bucket_cap_bytes >= 1, f"fifo: bucket_cap_bytes must be >= 1, got {self.bucket_cap_bytes}")
        require(
            self.first_bucket_bytes >= 1, f"fifo: first_bucket_bytes must be >= 1, got {self.first_bucket_bytes}"
        )

    def build(self) -> Policy:
        flow = InOrderBuckets(self.first_bucket_bytes, self.bucket_cap_bytes)
        return Policy(self.name, WholeTensors(), ReverseForward(), flow, cross_barrier=False)

    @classmethod
    def ddp_buckets(cls, bucket_cap_bytes: int = 25 * MiB, wire_ratio: float = 1.0) -> FifoConfig:
        """DDP's buckets as a plan counts bytes. DDP caps its buckets (``bucket_cap_bytes``,
        and its 1 MiB first one) in gradient bytes of the parameters' own dtype, also under a
        compression hook; a plan counts bytes on the wire, ``wire_ratio`` of those (0.5 for
        float32 gradients sent as bf16/fp16), so the same buckets have caps that much smaller.

        >>> FifoConfig.ddp_buckets(wire_ratio=0.5).bucket_cap_bytes == 25 * MiB // 2
        True
        """
        require(wire_ratio > 0, f"fifo: wire_ratio must be > 0, got {wire_ratio}")
        return cls(bucket_cap_bytes=max(1, int(bucket_cap_bytes * wire_ratio)),
                   first_bucket_bytes=max(1, int(cls.first_bucket_bytes * wire_ratio)))
