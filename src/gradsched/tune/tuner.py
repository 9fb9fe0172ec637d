"""An ask/tell tuner over a :class:`~gradsched.tune.space.SearchSpace`: the caller owns the
loop (a simulation, or a window of real iterations) and reports each candidate's
iteration time.

Optuna does the Bayesian optimisation. The default sampler is its Gaussian-process sampler:
with two or three continuous dimensions and a budget of about fifteen measurements, a GP
model of the iteration time uses every measurement to place the next one, as ByteScheduler's
own tuner does; TPE (``sampler="tpe"``) needs more trials before it beats random search.
The policy's default options are always measured first, so the result is never worse than
the default and the gain over it is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core import policy_config
from ..extras import require
from .space import SAMPLERS, SearchSpace

optuna = require("optuna", "tune")
require("scipy", "tune")  # Optuna's Gaussian-process sampler


@dataclass(frozen=True)
class Candidate:
    number: int
    options: dict[str, Any]  # repaired: what the policy runs with
    default: bool  # the policy's own defaults


class Tuner:
    def __init__(self, space: SearchSpace, seed: int = 0, sampler: str = "gp", startup_trials: int = 4,
                 start: dict[str, Any] | None = None) -> None:
        """``start``: the options measured first (default: the policy's defaults; required where
        they are derived from the link, see ``PolicyConfig.for_link``)."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        if startup_trials < 1:
            raise ValueError(f"startup_trials must be >= 1, got {startup_trials}")
        self.space = space
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        if sampler == "gp":
            chosen = optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials, deterministic_objective=False)
        elif sampler == "tpe":
            chosen = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
        else:
            chosen = optuna.samplers.RandomSampler(seed=seed)
        self.study = optuna.create_study(direction="minimize", sampler=chosen)
        defaults = policy_config(space.policy)
        start = start or {d.option: getattr(defaults, d.option) for d in space.dimensions}
        derived = [option for option, value in start.items() if value is None]
        if derived:
            raise ValueError(f"{space.policy}: {', '.join(derived)} derived from the link: give the starting "
                             f"options (the policy's for_link() on the link tuned for)")
        self.default_options = space.repair(start)
        space.validate(self.default_options)
        self.study.enqueue_trial({d.option: float(min(max(self.default_options[d.option], d.low), d.high))
                                  for d in space.dimensions})
        self._asked: dict[int, tuple[optuna.trial.Trial, Candidate]] = {}
        self.history: list[dict[str, Any]] = []

    def ask(self) -> Candidate:
        trial = self.study.ask()
        raw = {}
        for d in self.space.dimensions:
            # sizes too are searched as continuous values (rounded to bytes here): Optuna's GP
            # sampler would enumerate every integer of a 64 KiB .. 64 MiB range
            value = trial.suggest_float(d.option, d.low, d.high, log=True)
            raw[d.option] = int(round(value)) if d.integer else value
        first = trial.number == 0
        candidate = Candidate(trial.number, self.default_options if first else self.space.repair(raw), first)
        self._asked[trial.number] = (trial, candidate)
        return candidate

    def tell(self, candidate: Candidate, iteration_s: float) -> None:
        if candidate.number not in self._asked:
            raise ValueError(f"candidate {candidate.number} was not asked for, or was told already")
        if not (iteration_s > 0 and math.isfinite(iteration_s)):
            raise ValueError(f"iteration time must be a positive number, got {iteration_s!r}")
        trial, _ = self._asked.pop(candidate.number)
        self.study.tell(trial, iteration_s)
        best = min([h["iteration_s"] for h in self.history] + [iteration_s])
        self.history.append({"trial": candidate.number, "options": candidate.options, "default": candidate.default,
                             "iteration_s": iteration_s, "best_s": best})

    @property
    def best(self) -> dict[str, Any] | None:
        """The fastest candidate so far (the default wins ties), or None before any."""
        if not self.history:
            return None
        return min(self.history, key=lambda h: (h["iteration_s"], not h["default"]))

    @property
    def default_result(self) -> dict[str, Any] | None:
        return next((h for h in self.history if h["default"]), None)
