"""Tuning against the simulator: each candidate is one simulation of the same setting.

>>> from gradsched.models import model_table
>>> from gradsched.sim import Cluster
>>> from gradsched.tune import default_space
>>> result = tune_offline(model_table("resnet50"), Cluster(16, bandwidth_bps=10e9),
...                       default_space("bytescheduler"), trials=3, seed=0)
>>> len(result.history), result.best["iteration_s"] <= result.default["iteration_s"]
(3, True)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

from ..core import policy_config
from ..models.table import ModelTable
from ..sim import Cluster, predict
from .space import SearchSpace
from .tuner import Tuner


@dataclass(frozen=True)
class TuneResult:
    policy: str
    best: dict[str, Any]  # {"options", "iteration_s", ...}
    default: dict[str, Any]
    history: list[dict[str, Any]]
    bound_s: float


def simulate_options(table: ModelTable, cluster: Cluster, policy: str, options: dict[str, Any],
                     iterations: int = 6) -> float:
    """The simulated steady-state iteration time of ``policy`` with ``options``."""
    return predict(table, cluster, policy_config(policy, **options), iterations)


def starting_options(table: ModelTable, cluster: Cluster, space: SearchSpace) -> dict[str, Any]:
    """The policy's default options on this model and cluster (sizes it derives from the link
    filled in): what the tuner measures first."""
    defaults = policy_config(space.policy).for_link(table.gradient_bytes, cluster.latency_s,
                                                    cluster.phase_seconds_per_byte, cluster.overhead_s)
    return {d.option: getattr(defaults, d.option) for d in space.dimensions}


def tune_offline(table: ModelTable, cluster: Cluster, space: SearchSpace, trials: int = 15, seed: int = 0,
                 sampler: str = "gp", progress: Callable[[dict[str, Any]], None] | None = None,
                 start: dict[str, Any] | None = None) -> TuneResult:
    """Tune ``space.policy`` for this model and cluster with ``trials`` simulations (the
    first is ``start``, by default the policy's defaults on this cluster)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    tuner = Tuner(space, seed=seed, sampler=sampler, start=start or starting_options(table, cluster, space))
    for _ in range(trials):
        candidate = tuner.ask()
        tuner.tell(candidate, simulate_options(table, cluster, space.policy, candidate.options))
        if progress:
            progress(tuner.history[-1])
    bound = max(table.compute_s, cluster.comm_time(table.gradient_bytes))
    return TuneResult(space.policy, tuner.best, tuner.default_result, list(tuner.history), bound)


def grid_search(table: ModelTable, cluster: Cluster, space: SearchSpace, points: int = 8) -> dict[str, Any]:
    """The best of an exhaustive log-spaced grid over the same space (``points`` per
    dimension), for judging the tuner."""
    best = None
    axes = [d.grid(points) for d in space.dimensions]
    for values in itertools.product(*axes):
        options = space.repair({d.option: v for d, v in zip(space.dimensions, values)})
        seconds = simulate_options(table, cluster, space.policy, options)
        if best is None or seconds < best["iteration_s"]:
            best = {"options": options, "iteration_s": seconds}
    return best
