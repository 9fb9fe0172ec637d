"""Which rank is slow: every rank's backward pass compared at a control point.

A rank whose compute is slower than the others' (thermal throttling, a noisy neighbour) holds
every collective up: the others wait for its gradients at each reduction, so their own timings
show waits, not the cause. Each rank measures its own backward pass (from the end of its
forward pass to its last gradient, which no reduction delays), the ranks exchange the medians
at control points, and :func:`compare_ranks` names the slowest one when it is slower than the
median of the other ranks by more than :data:`SLOW_RATIO` (the others: with two ranks, a median
that counted the slow one would halve what it is slower by). Plans are then made on that rank's ready times:
a collective completes when its last rank contributes, so the slow rank's gaps between
gradients are the ones a plan can fill.

>>> report = compare_ranks([0.200, 0.204, 0.290, 0.198])
>>> report.slow_rank, round(report.ratio, 2), report.median_s
(2, 1.45, 0.2)
>>> round(compare_ranks([0.200, 0.300]).ratio, 2)  # two ranks: the slow one against the other
1.5
>>> compare_ranks([0.200, 0.210]).slow_rank is None  # 5% apart: noise, nobody named
True
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

#: a rank whose backward pass takes this many times the other ranks' median is named slow (below it,
#: the ranks of a replay differ by a few percent between runs)
SLOW_RATIO = 1.10


@dataclass(frozen=True)
class RanksReport:
    """Every rank's median backward pass at the latest control point, and the verdict."""

    backward_s: tuple[float | None, ...]  # per rank, in rank order (None: nothing measured there yet)
    median_s: float  # the other ranks' median (all but the slowest)
    slow_rank: int | None  # the slowest rank, where it is slow by more than SLOW_RATIO; else None
    ratio: float  # the slowest rank's backward pass over the others' median (1.0: all alike)

    def describe(self) -> str:
        """The verdict in words (for the log)."""
        if self.slow_rank is None:
            return f"the ranks' backward passes are within {SLOW_RATIO - 1:.0%} of each other"
        slow = self.backward_s[self.slow_rank]
        return (f"rank {self.slow_rank} is slow: its backward pass takes {self.ratio:.2f}x the other ranks' "
                f"median ({slow * 1e3:.1f} ms against {self.median_s * 1e3:.1f} ms); every reduction waits for it, "
                f"and plans are made on its ready times")


def compare_ranks(backward_s: Sequence[float | None]) -> RanksReport | None:
    """The report for every rank's median backward pass (seconds, in rank order; None where a
    rank measured none yet); None where fewer than two ranks measured one."""
    measured = [(rank, s) for rank, s in enumerate(backward_s) if s is not None and s > 0]
    if len(measured) < 2:
        return None
    slowest, seconds = max(measured, key=lambda item: (item[1], -item[0]))
    median = statistics.median(s for rank, s in measured if rank != slowest)
    ratio = seconds / median if median > 0 else 1.0
    return RanksReport(tuple(backward_s), median, slowest if ratio > SLOW_RATIO else None, ratio)
