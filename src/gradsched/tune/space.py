"""What the tuner searches: a few numeric options of one policy, each on a log scale.

Partition and credit sizes matter by orders of magnitude (a 64 KiB slice and a 16 MiB
slice behave very differently; 4 and 5 MiB hardly do), so each dimension is searched on a
log scale between two bounds. A candidate that the policy would reject (a credit window
smaller than one slice) is repaired by raising the credit to one slice, and the repaired
options are what is measured and reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..core import policy_config
from ..units import parse_bytes

SAMPLERS = ("gp", "tpe", "random")  # Optuna's samplers the tuner offers

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Dimension:
    option: str  # the policy option, e.g. "partition_bytes"
    low: float
    high: float
    integer: bool = True

    def __post_init__(self) -> None:
        if not (self.low > 0 and self.high > 0):
            raise ValueError(f"search space: {self.option} bounds must be > 0, got [{self.low}, {self.high}]")
        if self.low > self.high:
            raise ValueError(f"search space: {self.option} has low {self.low} > high {self.high}")

    def grid(self, points: int) -> list[float]:
        """``points`` values evenly spaced on a log scale, both bounds included."""
        if points == 1 or self.low == self.high:
            return [self._cast(self.low)]
        step = (math.log(self.high) - math.log(self.low)) / (points - 1)
        return [self._cast(math.exp(math.log(self.low) + i * step)) for i in range(points)]

    def _cast(self, value: float) -> float:
        return int(round(value)) if self.integer else value


@dataclass(frozen=True)
class SearchSpace:
    policy: str
    dimensions: tuple[Dimension, ...]

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise ValueError("search space: no dimension to search")
        for dim in self.dimensions:
            _check_option(self.policy, dim.option)
        names = [d.option for d in self.dimensions]
        if len(set(names)) != len(names):
            raise ValueError(f"search space: an option appears twice: {names}")
        self.validate(self.repair({d.option: d.low for d in self.dimensions}))  # the bounds make sense
        self.validate(self.repair({d.option: d.high for d in self.dimensions}))

    def repair(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Options the policy accepts: a credit window holds at least one slice."""
        fixed = dict(options)
        if "credit_bytes" in fixed and "partition_bytes" in fixed:
            fixed["credit_bytes"] = max(fixed["credit_bytes"], fixed["partition_bytes"])
        elif "credit_bytes" in fixed:  # a derived slice is cut to fit the window (see for_link)
            fixed["credit_bytes"] = max(fixed["credit_bytes"], policy_config(self.policy).partition_bytes or 1)
        return fixed

    def validate(self, options: Mapping[str, Any]) -> None:
        try:
            policy_config(self.policy, **options)
        except ValueError as exc:
            raise ValueError(f"search space: {exc}") from exc


DEFAULT_RANGES: dict[str, dict[str, tuple[float, float, bool]]] = {
    "bytescheduler": {"partition_bytes": (64 * KiB, 64 * MiB, True), "credit_bytes": (256 * KiB, 256 * MiB, True)},
    "priority": {"partition_bytes": (64 * KiB, 64 * MiB, True)},
    "prophet": {"partition_bytes": (64 * KiB, 16 * MiB, True), "credit_bytes": (1 * MiB, 256 * MiB, True),
                "stage_factor": (1.2, 8.0, False)},
}


def default_space(policy: str, overrides: Mapping[str, str] | None = None) -> SearchSpace:
    """The default search space of ``policy``; ``overrides`` maps an option to "LOW:HIGH"
    (sizes may carry units, e.g. ``{"partition_bytes": "256KiB:8MiB"}``)."""
    if policy not in DEFAULT_RANGES:
        raise ValueError(f"nothing to tune for policy {policy!r}; tunable: {', '.join(DEFAULT_RANGES)}")
    ranges = dict(DEFAULT_RANGES[policy])
    for option, text in (overrides or {}).items():
        _check_option(policy, option)
        low, colon, high = str(text).partition(":")
        if not colon:
            raise ValueError(f"search space: write {option}=LOW:HIGH, got {text!r}")
        integer = option.endswith("_bytes")
        ranges[option] = (_bound(option, low, integer), _bound(option, high, integer), integer)
    return SearchSpace(policy, tuple(Dimension(o, lo, hi, i) for o, (lo, hi, i) in ranges.items()))


def _check_option(policy: str, option: str) -> None:
    known = {f.name for f in fields(type(policy_config(policy)))}
    if option not in known:
        raise ValueError(f"search space: policy {policy!r} has no option {option!r}; it has: {', '.join(sorted(known))}")


def _bound(option: str, text: str, size: bool) -> float:
    try:
        return parse_bytes(text) if size else float(text)
    except ValueError as exc:
        detail = exc if size else f"invalid number {text!r}"
        raise ValueError(f"search space: {option}: {detail}") from None


def around(space: SearchSpace, start: Mapping[str, Any], factor: float = 8.0,
           keep: tuple[str, ...] = ()) -> SearchSpace:
    """``space`` narrowed to within ``factor`` of the ``start`` options on each side (a
    trust region), except the options in ``keep``. Online every candidate costs real
    iterations, so the search stays near options that already work instead of spending
    trials on, say, 64 KiB slices where 4 MiB ones run."""
    dims = []
    for d in space.dimensions:
        value = start.get(d.option)
        if d.option in keep or value is None or d.integer is False:
            dims.append(d)
            continue
        low, high = max(d.low, value / factor), min(d.high, value * factor)
        dims.append(Dimension(d.option, min(low, value), max(high, value), d.integer))
    return SearchSpace(space.policy, tuple(dims))
