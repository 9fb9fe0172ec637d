"""What one wrapped run measured and decided, kept as long as the wrap: the plans adopted, the
link estimate, the simulator's prediction, the measured trial, the online tuner's report, the
plan switches, the latest rounds' timings (the profile ``export_profile`` writes) and the
ranks' compared backward passes.

The run's record holds it (:class:`gradsched.runtime.training.run.Run`); the backend that plans
writes into it (gradsched's data plane: its exchange fits the estimate, its planner the rest),
and nothing in it refers back to that backend
and ``stats()`` and ``export_profile()`` read it, also once that backend has stopped (after the
hand-off to DDP's reducer, what the plane found stays readable though the plane is gone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gradsched.control import TrialReport, TuningReport
from gradsched.control.ranks import RanksReport
from gradsched.core.estimator import LinkEstimator
from gradsched.core.plan import Plan
from gradsched.files import problem_writing
from gradsched.models.table import ModelTable
from gradsched.runtime.diagnostics.stats import Prediction
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.planning.clock import Clock
from gradsched.runtime.planning.profiling import RoundTiming, measured_table


@dataclass(eq=False)
class Measurements:
    estimator: LinkEstimator = field(default_factory=LinkEstimator)  # fitted from every completed message
    adopted: list[tuple[int, Plan]] = field(default_factory=list)  # (first round, plan): the latest two adopted
    plans_adopted: int = 0
    settled_round: int = 0  # the first round on the plan chosen after profiling and the measured arms
    prediction: Prediction | None = None  # the simulated comparison with DDP-style buckets
    trial: TrialReport | None = None  # the measured comparison with DDP-style buckets
    tuning: TuningReport | None = None  # the online tuner's report, once it finished
    switches: list[tuple[int, str]] = field(default_factory=list)  # (first round, policy) of every plan adopted
    timings: list[RoundTiming] = field(default_factory=list)  # of the latest closed rounds
    owners: Mapping[str, Sequence[str]] = field(default_factory=dict)  # module -> the parameters it waits for
    sizes: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # parameter -> (elements, bytes each)
    ranks: RanksReport | None = None  # every rank's backward pass at the latest control point, and the slow one
    planned_on: int | None = None  # rank 0: the rank whose ready times its latest proposal was made on

    def adopt(self, plan: Plan, first_round: int) -> None:
        """``plan`` is followed from round ``first_round`` on."""
        self.plans_adopted += 1
        self.adopted = (self.adopted + [(first_round, plan)])[-2:]

    def plan_for(self, round_index: int) -> Plan | None:
        """The plan round ``round_index`` follows (None: nothing planned yet)."""
        following = [plan for first, plan in self.adopted if first <= round_index]
        return following[-1] if following else self.adopted[0][1] if self.adopted else None

    def complete_timings(self, clock: Clock, rounds: int) -> list[RoundTiming]:
        """The latest ``rounds`` measured rounds (the first one warms up) in which every parameter
        got a gradient, in device times (``clock``: resolved once, where a rank stops anyway)."""
        self.timings = [clock.resolve(t) for t in self.timings]
        return [t for t in self.timings[1:] if len(t.ready) == len(self.sizes)][-rounds:]

    def table(self, clock: Clock, rounds: int, name: str = "measured") -> ModelTable | None:
        """This rank's measured per-layer table (the medians of the latest complete rounds), or
        None before there is one."""
        timings = self.complete_timings(clock, rounds)
        return measured_table(timings, self.owners, self.sizes, name) if timings else None

    def export_profile(self, path: str, name: str, clock: Clock, rounds: int) -> str:
        """Write :meth:`table` as a JSON profile (docs/profile-format.md); returns ``path``."""
        problem = problem_writing(path)
        if problem:
            raise ValueError(f"export_profile({path!r}): {problem}")
        table = self.table(clock, rounds, name)
        if table is None:
            raise GradschedError(
                "export_profile: nothing measured yet: run a few training iterations first (the first backward "
                "pass warms up; every parameter must get a gradient in the rounds measured)"
            )
        table.save(path)
        return path
