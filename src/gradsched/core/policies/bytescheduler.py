"""``bytescheduler``: priority + partitioning + a credit window, crossing the iteration barrier.

Tensors are cut into slices of ``partition_bytes``; ready slices are sent most urgent
first while the bytes in flight stay within ``credit_bytes``. A larger credit keeps the
link busy through per-message latency; a smaller one lets a newly ready urgent slice
overtake sooner. The next forward of a layer waits only for that layer's update.

Ours, by default:

* the slice size and the window are derived from the link as measured (its per-message
  cost, latency and cost per byte) and the model's gradient bytes, as Prophet's blocks
  are (see :mod:`gradsched.core.sizing`); set ``partition_bytes`` and ``credit_bytes`` to
  fix them (the original: 4 MiB slices in a 16 MiB window);
* small tensors (biases, norms) do not each pay the link's per-message cost. While the link
  is busy they wait and travel fused, in messages of at least ``amortise`` times that cost
  in link time (measured, so the size follows the link: about 1.4 MB at 3 Gbit/s and
  0.4 ms per message); ``amortise=0`` is the original policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..base import Policy, PolicyConfig, require
from ..credit import AMORTISE, CreditWindow
from ..ordering import ByPriority
from ..partitioning import FixedSize
from ..sizing import credit_for, partition_for


@dataclass(frozen=True)
class ByteSchedulerConfig(PolicyConfig):
    """Priority + partition + credit (ByteScheduler, SOSP'19)."""

    name: ClassVar[str] = "bytescheduler"
    partition_bytes: int | None = None  # slice size (None: derived from the link and the model, see for_link)
    credit_bytes: int | None = None  # bytes in flight at most (None: three slices, see for_link)
    fuse_bytes: int = 0  # fuse consecutive slices up to this size (0: as the original, at least with amortise=0)
    amortise: float = AMORTISE  # small messages wait (fused with the next) while the link is busy, until each
    #   carries this many times the link's measured per-message cost (0: the original, every slice alone)

    def __post_init__(self) -> None:
        for option in ("partition_bytes", "credit_bytes"):
            value = getattr(self, option)
            require(value is None or (isinstance(value, (int, float)) and value >= 1),
                    f"bytescheduler: {option} must be a size >= 1 byte or None (derived), got {value!r}")
        if self.partition_bytes is not None and self.credit_bytes is not None:
            require(
                self.credit_bytes >= self.partition_bytes,
                f"bytescheduler: credit_bytes ({self.credit_bytes}) must be >= partition_bytes "
                f"({self.partition_bytes}) so that a whole slice fits in the window",
            )
        require(self.fuse_bytes >= 0, f"bytescheduler: fuse_bytes must be >= 0, got {self.fuse_bytes}")
        require(self.amortise >= 0, f"bytescheduler: amortise must be >= 0, got {self.amortise}")

    @property
    def derived(self) -> bool:
        """Whether a size is still to be derived from the link (:meth:`for_link`)."""
        return self.partition_bytes is None or self.credit_bytes is None

    def for_link(self, total_bytes: int, latency_s: float, seconds_per_byte: float,
                 overhead_s: float) -> ByteSchedulerConfig:
        """The sizes not set derived from this link and ``total_bytes`` of gradients: the slice
        by :func:`~gradsched.core.sizing.partition_for` (at most a given window), the window by
        :func:`~gradsched.core.sizing.credit_for` (at least a given slice)."""
        if not self.derived:
            return self
        partition = self.partition_bytes
        if partition is None:
            partition = partition_for(total_bytes, seconds_per_byte, overhead_s, latency_s)
            partition = min(partition, self.credit_bytes or partition)
        credit = self.credit_bytes if self.credit_bytes is not None else credit_for(partition)
        return replace(self, partition_bytes=partition, credit_bytes=credit)

    def build(self) -> Policy:
        if self.derived:  # no link to derive from: the sizes for a link not yet measured
            return self.for_link(0, 0.0, 0.0, 0.0).build()
        flow = CreditWindow(self.credit_bytes, self.fuse_bytes, amortise=self.amortise)
        return Policy(self.name, FixedSize(self.partition_bytes), ByPriority(), flow, cross_barrier=True)
