"""The measured-arms experiment with exact sequences of measured times: which arm runs
what, which options are kept, and when the buckets win. A real seeded tuner proposes the
candidates; no processes are needed."""

from __future__ import annotations

import pytest

from gradsched.control import ArmKind, ArmsExperiment, TrialReport, arm_kinds
from gradsched.tune import Tuner, default_space

START = {"partition_bytes": 4 << 20, "credit_bytes": 16 << 20}


def tuner() -> Tuner:
    return Tuner(default_space("bytescheduler"), seed=3, sampler="random", start=START)


def run(experiment: ArmsExperiment, times: list[float | None]) -> list:
    """Ask for every arm and tell it ``times[k]`` (each arm measured as one iteration)."""
    arms = []
    for k, seconds in enumerate(times):
        arm = experiment.ask()
        arms.append(arm)
        experiment.tell(arm, [] if seconds is None else [seconds], plan=f"plan {k}")
    assert experiment.done
    return arms


def test_arm_kinds():
    P, B, C, X = ArmKind.POLICY, ArmKind.BUCKETS, ArmKind.CANDIDATE, ArmKind.CONFIRM
    assert arm_kinds(fallback=False) == ()
    assert arm_kinds(fallback=True) == (P, B)
    assert arm_kinds(fallback=True, autotune_trials=3) == (P, B, C, C, X)
    assert arm_kinds(fallback=False, autotune_trials=2) == (P, C, X)


def test_an_arm_is_the_median_of_its_iterations():
    experiment = ArmsExperiment(arm_kinds(fallback=True), {}, 0.02)
    arm = experiment.ask()
    assert experiment.tell(arm, [0.5, 0.3, 0.31, 0.9], plan=None) == pytest.approx(0.405)


@pytest.mark.parametrize("policy_s,fifo_s,use_fifo", [(0.90, 1.00, False), (0.985, 1.00, True), (1.10, 1.00, True)])
def test_the_policy_must_beat_the_buckets_by_the_gain(policy_s, fifo_s, use_fifo):
    experiment = ArmsExperiment(arm_kinds(fallback=True), {}, 0.02)
    policy, buckets = run(experiment, [policy_s, fifo_s])
    assert (policy.kind, policy.options) == (ArmKind.POLICY, {})
    assert (buckets.kind, buckets.options) == (ArmKind.BUCKETS, None)
    decision = experiment.decide()
    assert decision.trial == TrialReport(policy_s, fifo_s, use_fifo)
    assert decision.options == (None if use_fifo else {})
    assert decision.plan == ("plan 1" if use_fifo else "plan 0")  # the very plan that was measured
    assert decision.tuning is None


def test_nothing_measured_decides_nothing():
    experiment = ArmsExperiment(arm_kinds(fallback=True), {}, 0.02)
    run(experiment, [None, 0.3])
    assert experiment.decide() is None


def tuned(times: list[float], fallback: bool = False) -> tuple[list, object]:
    experiment = ArmsExperiment(arm_kinds(fallback, autotune_trials=4), tuner().default_options, 0.02, tuner())
    arms = run(experiment, times)
    return arms, experiment.decide()


def test_a_confirmed_candidate_replaces_the_start():
    # start 1.00; candidates 0.90, 0.95, 1.20; the confirming arm re-measures the 0.90 one: 0.93
    arms, decision = tuned([1.00, 0.90, 0.95, 1.20, 0.93])
    start, fastest, confirm = arms[0], arms[1], arms[4]
    assert start.options == START and fastest.options != START
    assert confirm.kind == ArmKind.CONFIRM and confirm.options == fastest.options
    assert confirm.plan == "plan 1"  # re-run as it was measured
    assert decision.options == fastest.options and decision.plan == "plan 1"
    report = decision.tuning
    assert report.best_s == pytest.approx(0.915) and report.default_s == pytest.approx(1.00)
    assert report.confirm == {"options": fastest.options, "iteration_s": 0.93}
    assert [h["iteration_s"] for h in report.history] == [1.00, 0.90, 0.95, 1.20]


def test_a_lucky_arm_is_not_kept():
    # the 0.80 candidate measures 1.30 when confirmed (mean 1.05); the 0.95 one was measured once
    arms, decision = tuned([1.00, 0.80, 0.95, 1.20, 1.30])
    assert decision.options == START and decision.plan == "plan 0"
    assert decision.tuning.best_s == pytest.approx(1.00)


def test_a_confirmed_candidate_within_the_gain_is_not_kept():
    _, decision = tuned([1.00, 0.97, 1.10, 1.20, 1.00])  # mean 0.985: not 2% faster than 1.00
    assert decision.options == START


def test_the_kept_options_must_also_beat_the_buckets():
    # policy 1.00, buckets 0.92, candidates 0.90, 0.95, 1.2, confirmed at 0.93 (mean 0.915)
    arms, decision = tuned([1.00, 0.92, 0.90, 0.95, 1.20, 0.93], fallback=True)
    assert arms[1].kind == ArmKind.BUCKETS
    assert decision.trial == TrialReport(pytest.approx(0.915), 0.92, True)
    assert decision.options is None and decision.plan == "plan 1"
    assert decision.tuning.best_options == arms[2].options  # what the tuner found, reported anyway


def test_misuse_is_refused():
    with pytest.raises(ValueError, match="at least one arm"):
        ArmsExperiment((), {}, 0.02)
    with pytest.raises(ValueError, match="need a tuner"):
        ArmsExperiment(arm_kinds(True, autotune_trials=2), {}, 0.02)
    with pytest.raises(ValueError, match="gain"):
        ArmsExperiment(arm_kinds(True), {}, 1.0)
    experiment = ArmsExperiment(arm_kinds(fallback=True), {}, 0.02)
    arm = experiment.ask()
    with pytest.raises(RuntimeError, match="not told yet"):
        experiment.ask()
    experiment.tell(arm, [1.0], None)
    with pytest.raises(ValueError, match="not the arm asked for"):
        experiment.tell(arm, [1.0], None)
    experiment.tell(experiment.ask(), [1.0], None)
    with pytest.raises(RuntimeError, match="decide"):
        experiment.ask()
