"""What a wrapped run reports: ``optimizer.stats``.

>>> stats = RunStats("prophet", rounds=12, plan_messages=9, plans_adopted=3, link_latency_s=1e-4,
...                  link_bytes_per_s=3e8, plan_policy="prophet", settled_round=20)
>>> stats.fell_back, stats.as_dict()["plan_policy"]
(False, 'prophet')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gradsched.control.arms import TrialReport, TuningReport
from gradsched.control.ranks import RanksReport
from gradsched.core.policies import is_buckets


@dataclass(frozen=True)
class Prediction:
    """The simulator's view of the measured trial (the measured model on the probed link).
    When the link estimate cannot separate per-message from per-byte cost, the policy must
    win under both attributions for ``use_fifo`` to be False."""

    compute_s: float  # forward + backward of the measured model
    latency_s: float
    overhead_s: float  # per message, serial
    comm_s: float  # every gradient byte once at the measured rate
    policy_s: float  # predicted iteration time of the policy
    fifo_s: float  # ... and of DDP-style buckets
    separable: bool  # per-message and per-byte cost told apart
    use_fifo: bool  # the prediction's verdict (reported; the measurement decides)


@dataclass(frozen=True)
class RunStats:
    policy: str  # the policy asked for
    rounds: int  # backward passes that communicated
    plan_messages: int  # messages per round in the plan in use
    plans_adopted: int
    link_latency_s: float  # the link estimate from completed messages
    link_bytes_per_s: float
    plan_policy: str  # the policy whose plans run now ("fifo" after losing the measured trial)
    settled_round: int  # the first round on the plan chosen after profiling and the measured arms
    prediction: Prediction | None = None
    trial: TrialReport | None = None  # the measured comparison with DDP-style buckets (with fallback)
    autotune: TuningReport | None = None  # the online tuner's report (with autotune)
    switches: list[tuple[int, str]] = field(default_factory=list)  # (first round, policy) of every plan change
    handed_off_round: int | None = None  # the buckets kept were handed to DDP's C++ reducer from this round on
    # what scheduling bought, the medians of the latest 20 training iterations (forward start to forward start;
    # None before two; after a hand-off, those before it: DDP's reducer then waits inside backward, unseen)
    iteration_s: float | None = None
    exposed_s: float | None = None  # of it, the training thread's waits for communication (forward pre-hooks,
    #   step(), reads of a gradient on the wire, clipping)
    exposed_share: float | None = None  # exposed_s / iteration_s, per iteration
    plan_options: dict[str, Any] = field(default_factory=dict)  # the options of plan_policy's plan in use,
    #   the sizes it derived from the link included (bytescheduler's slice and window)
    ranks: RanksReport | None = None  # every rank's backward pass at the latest control point, and the slow
    #   rank if one is (gradsched.control.ranks); None on one rank, or before the first control point

    @property
    def slow_rank(self) -> int | None:
        """The rank every reduction waits for, slower than the other ranks' median by more than 10%
        (its backward pass); None where none is, or nothing was compared."""
        return None if self.ranks is None else self.ranks.slow_rank

    @property
    def trial_gain(self) -> float | None:
        """How much faster the policy measured than DDP-style buckets in the trial (0.1: 10%
        faster; negative: slower), or None without a trial."""
        if self.trial is None or not self.trial.policy_s:
            return None
        return self.trial.fifo_s / self.trial.policy_s - 1.0

    @property
    def fell_back(self) -> bool:
        """The run uses DDP-style buckets instead of the policy asked for."""
        return is_buckets(self.plan_policy) and not is_buckets(self.policy)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), nested reports included."""
        return dataclasses.asdict(self)
