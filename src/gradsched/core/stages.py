"""Prophet's stage detection: gradients arrive in bursts separated by compute gaps.

Given when each gradient became ready (relative to the start of the backward pass), sort
the arrivals and close a stage wherever the gap to the next arrival exceeds ``factor``
times the mean inter-arrival gap. The result says which tensors form each stage and how
long the link has, after each stage, before the next one arrives.

>>> plan = detect_stages({"a": 0.0, "b": 0.001, "c": 0.010, "d": 0.0105})
>>> [s.tensors for s in plan.stages], [round(s.gap_after, 4) for s in plan.stages]
([('a', 'b'), ('c', 'd')], [0.009, 0.0])
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Stage:
    tensors: tuple[str, ...]  # in arrival order
    start: float  # first arrival, seconds after the backward pass began
    end: float  # last arrival
    gap_after: float  # seconds from ``end`` to the next stage's first arrival; 0 for the last


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    threshold: float  # the inter-arrival gap above which a stage closed
    stage_of: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {name: k for k, stage in enumerate(self.stages) for name in stage.tensors}
        object.__setattr__(self, "stage_of", index)


def detect_stages(ready_times: Mapping[str, float], factor: float = 2.0) -> StagePlan:
    """Split arrivals into stages; ties keep the mapping's order."""
    if not ready_times:
        raise ValueError("detect_stages needs at least one ready time")
    if factor <= 0:
        raise ValueError(f"stage threshold factor must be > 0, got {factor}")
    order = sorted(ready_times, key=ready_times.__getitem__)  # stable: ties keep mapping order
    times = [ready_times[n] for n in order]
    gaps = [b - a for a, b in zip(times, times[1:])]
    threshold = factor * (sum(gaps) / len(gaps)) if gaps else 0.0
    stages = []
    first = 0
    for i, gap in enumerate(gaps):
        if gap > threshold and gap > 0.0:
            stages.append((first, i, gap))
            first = i + 1
    stages.append((first, len(order) - 1, 0.0))
    return StagePlan(
        tuple(Stage(tuple(order[a : b + 1]), times[a], times[b], gap) for a, b, gap in stages),
        threshold,
    )


class ReadyProfile:
    """Collects ready times over profiled iterations; the plan uses per-tensor medians."""

    def __init__(self) -> None:
        self._times: dict[str, list[float]] = {}
        self.iterations = 0
        self._origin: float | None = None

    def begin_iteration(self, now: float) -> None:
        self._origin = now
        self.iterations += 1

    def record(self, name: str, now: float) -> None:
        if self._origin is None:
            raise RuntimeError("ReadyProfile.record before begin_iteration")
        self._times.setdefault(name, []).append(now - self._origin)

    def median_times(self) -> dict[str, float]:
        return {name: statistics.median(ts) for name, ts in self._times.items()}
