"""When the runtime's control points happen, and what each one does.

A *round* is one backward pass that communicates (numbered from 1). After round ``r``,
``optimizer.step()`` on every rank asks :meth:`ControlSchedule.at` whether round ``r`` ends
at a control point; if so, every rank takes part in one broadcast from rank 0 and the plan
it carries takes effect from round ``r + 1``. The schedule is a pure function of the
configuration, so every rank knows it without asking.

* After ``profile_rounds`` measured rounds (the first round warms up and is not counted)
  the first measured *arm* starts; each arm runs ``trial_rounds`` rounds on one plan
  (:mod:`gradsched.control.arms` says which).
* After the last arm, the experiment is decided.
* Then, every ``replan_every`` rounds, rank 0 re-plans from fresh measurements.

>>> schedule = ControlSchedule(profile_rounds=3, trial_rounds=5, replan_every=50, arms=2)
>>> [(r, schedule.at(r)) for r in range(1, 16) if schedule.at(r)]
[(4, ControlPoint(Stage.ARM, 0)), (9, ControlPoint(Stage.ARM, 1)), (14, ControlPoint(Stage.DECIDE, 2))]
>>> schedule.at(64), schedule.measured_rounds(1), schedule.settled_round
(ControlPoint(Stage.REPLAN, 0), (11, 13), 15)
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass


class Stage(enum.Enum):
    ARM = "arm"  # start measured arm ``index``
    DECIDE = "decide"  # every arm is measured: choose
    REPLAN = "replan"  # a new plan of the chosen policy from fresh measurements

    def __repr__(self) -> str:
        return f"Stage.{self.name}"


@dataclass(frozen=True)
class ControlPoint:
    stage: Stage
    index: int = 0  # ARM: the arm that starts; DECIDE: the number of arms

    def __repr__(self) -> str:
        return f"ControlPoint({self.stage!r}, {self.index})"


@dataclass(frozen=True)
class ControlSchedule:
    profile_rounds: int  # measured rounds before the first control point
    trial_rounds: int  # rounds per measured arm
    replan_every: int  # rounds between later re-planning points; 0: never
    arms: int  # measured arms after profiling (0: plan once, then re-plan)

    def __post_init__(self) -> None:
        if self.profile_rounds < 1 or self.trial_rounds < 3 or self.replan_every < 0 or self.arms < 0:
            raise ValueError(f"invalid control schedule {self}: needs profile_rounds >= 1, trial_rounds >= 3, "
                             "replan_every >= 0 and arms >= 0")

    @property
    def first(self) -> int:
        """The round after which the first control point happens."""
        return self.profile_rounds + 1

    def arm_start(self, arm: int) -> int:
        """The round whose control point starts ``arm`` (it runs from the next round)."""
        return self.first + arm * self.trial_rounds

    @property
    def settled_round(self) -> int:
        """The first round that runs on the plan chosen after profiling and the arms (it
        holds until the next re-planning point)."""
        return self.arm_start(self.arms) + 1

    def at(self, round_index: int) -> ControlPoint | None:
        """What the control point after round ``round_index`` does (None: there is none)."""
        first = self.first
        if self.arms:
            end = self.arm_start(self.arms)
            if first <= round_index <= end:
                arm, offset = divmod(round_index - first, self.trial_rounds)
                if offset:
                    return None
                return ControlPoint(Stage.ARM, arm) if arm < self.arms else ControlPoint(Stage.DECIDE, self.arms)
            first = end
        every = self.replan_every
        if round_index == first or (every and round_index > first and (round_index - first) % every == 0):
            return ControlPoint(Stage.REPLAN)
        return None

    def with_arms(self, arms: int) -> ControlSchedule:
        """The same schedule with ``arms`` measured arms (more pairs measured: every rank
        extends its schedule at the same control point, told so by rank 0's broadcast there).

        >>> schedule = ControlSchedule(profile_rounds=3, trial_rounds=5, replan_every=50, arms=2)
        >>> longer = schedule.with_arms(4)
        >>> longer.at(14), longer.at(19), longer.at(24), longer.settled_round
        (ControlPoint(Stage.ARM, 2), ControlPoint(Stage.ARM, 3), ControlPoint(Stage.DECIDE, 4), 25)
        """
        return dataclasses.replace(self, arms=arms)

    def measured_rounds(self, arm: int) -> tuple[int, int]:
        """(first, last) round of ``arm`` whose iteration times count: not the first round
        on its plan (the switch) and not the last (the next arm's switch follows it)."""
        start = self.arm_start(arm)
        return start + 2, start + self.trial_rounds - 1
