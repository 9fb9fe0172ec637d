"""The control-point schedule: exact rounds for every configuration the runtime uses."""

from __future__ import annotations

import pytest

from gradsched.control import ControlPoint, ControlSchedule, Stage


def points(schedule: ControlSchedule, rounds: int) -> list[tuple[int, ControlPoint]]:
    return [(r, schedule.at(r)) for r in range(1, rounds + 1) if schedule.at(r) is not None]


def test_arms_then_decision_then_replanning():
    schedule = ControlSchedule(profile_rounds=2, trial_rounds=3, replan_every=4, arms=3)
    assert points(schedule, 24) == [
        (3, ControlPoint(Stage.ARM, 0)), (6, ControlPoint(Stage.ARM, 1)), (9, ControlPoint(Stage.ARM, 2)),
        (12, ControlPoint(Stage.DECIDE, 3)), (16, ControlPoint(Stage.REPLAN)), (20, ControlPoint(Stage.REPLAN)),
        (24, ControlPoint(Stage.REPLAN)),
    ]
    # arm k runs rounds 4+3k .. 6+3k; its first (the switch) and last round are not counted
    assert [schedule.measured_rounds(k) for k in range(3)] == [(5, 5), (8, 8), (11, 11)]
    assert schedule.settled_round == 13


def test_without_arms_the_first_point_plans_and_later_ones_replan():
    schedule = ControlSchedule(profile_rounds=3, trial_rounds=5, replan_every=10, arms=0)
    assert points(schedule, 30) == [(4, ControlPoint(Stage.REPLAN)), (14, ControlPoint(Stage.REPLAN)),
                                    (24, ControlPoint(Stage.REPLAN))]
    assert schedule.settled_round == 5


def test_replan_every_zero_plans_once():
    schedule = ControlSchedule(profile_rounds=1, trial_rounds=3, replan_every=0, arms=1)
    assert points(schedule, 100) == [(2, ControlPoint(Stage.ARM, 0)), (5, ControlPoint(Stage.DECIDE, 1))]


@pytest.mark.parametrize("bad", [dict(profile_rounds=0), dict(trial_rounds=2), dict(replan_every=-1), dict(arms=-1)])
def test_invalid_schedules_are_refused(bad):
    values = dict(profile_rounds=3, trial_rounds=5, replan_every=50, arms=2) | bad
    with pytest.raises(ValueError, match="invalid control schedule"):
        ControlSchedule(**values)
