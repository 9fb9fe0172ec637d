"""Online autotuning with real processes: every rank switches plans at the same steps, the
candidates are the seeded tuner's, the kept options are never slower than the start, and
the parameters after all the switches equal DDP's."""

from __future__ import annotations

import json

import pytest

from gradsched.control import ArmsExperiment, arm_kinds
from gradsched.tune import Tuner, default_space
from workers.launch import run_ranks


@pytest.mark.parametrize("world,servers", [(2, 0), pytest.param(3, 1, marks=pytest.mark.slow)])
def test_online_autotune_switches_together_and_keeps_the_best(tmp_path, world, servers):
    out = tmp_path / "out.json"
    results = run_ranks("autotune", world, str(out), "--servers", str(servers), timeout=180)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    reports = json.loads(out.read_text())
    assert len(reports) == world - servers
    first = reports[0]
    for report in reports:  # every plan switch kept the gradients DDP's (1e-5 absolute)
        assert report["max_abs_diff"] <= 1e-5 and report["moved"] > 1e-2, report
    for other in reports[1:]:
        assert other["switches"] == first["switches"]  # the agreed steps, identical on every rank
        assert other["autotune"] == first["autotune"]
        assert other["checksum"] == first["checksum"]
    # control points: after round 3 (profiling), then an arm of 3 rounds per candidate and
    # one that measures the best so far again (no switch where its plan already runs); at
    # the end the measured plan of the kept options (no switch if it already runs)
    steps = [s[0] for s in first["switches"]]
    assert steps[:6] == [4, 7, 10, 13, 16, 19] and set(steps[6:]) <= {22, 25}
    tuning = first["autotune"]
    history = tuning["history"]
    assert len(history) == 6 and history[0]["default"]
    assert history[0]["options"] == {"partition_bytes": 4096, "credit_bytes": 16384}  # the user's options first
    # the experiment rank 0 ran, re-run here with the seeded tuner and the measured times:
    # the same candidates (the first four from the tuner's start-up phase, the last two from
    # its Gaussian-process model), the same confirming arm and the same decision
    space = default_space("bytescheduler", {"partition_bytes": "1KiB:64KiB", "credit_bytes": "4KiB:256KiB"})
    tuner = Tuner(space, seed=7, start={"partition_bytes": 4096, "credit_bytes": 16384})
    experiment = ArmsExperiment(arm_kinds(fallback=False, autotune_trials=6), tuner.default_options, 0.02, tuner)
    confirm = tuning["confirm"]
    measured = [h["iteration_s"] for h in history] + [confirm["iteration_s"]]
    for k, seconds in enumerate(measured):
        arm = experiment.ask()
        assert arm.options == (history[k]["options"] if k < len(history) else confirm["options"])
        experiment.tell(arm, [seconds], plan=k)
    decision = experiment.decide()
    assert tuning["best_options"] == decision.options == decision.tuning.best_options
    assert tuning["best_s"] == pytest.approx(decision.tuning.best_s)
    assert tuning["default_s"] == pytest.approx(decision.tuning.default_s)
    if tuning["best_options"] == history[0]["options"]:  # kept the start: its own figure
        assert tuning["best_s"] == tuning["default_s"]
    else:  # replaced it: only by beating it by the gain
        assert tuning["best_s"] < tuning["default_s"] * (1 - 0.02)


@pytest.mark.slow  # make test stays under ten minutes; run with -m "slow or not slow"
@pytest.mark.parametrize("world,servers", [(2, 0), (3, 1)])
def test_online_autotune_starts_from_the_sizes_bytescheduler_derives(tmp_path, world, servers):
    """No sizes given: the tuner's first candidate is what bytescheduler derives from the link
    it measured (a window of three slices, the slice on its quarter-octave grid), every rank
    tunes the same way, and the parameters still equal DDP's; with parameter servers too,
    where the link is not probed."""
    import math

    from gradsched.core.sizing import CREDIT_SLICES, MAX_PARTITION, MIN_PARTITION

    out = tmp_path / "out.json"
    results = run_ranks("autotune", world, str(out), "--derived", "--servers", str(servers), timeout=180)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    reports = json.loads(out.read_text())
    for report in reports:
        assert report["max_abs_diff"] <= 1e-5 and report["moved"] > 1e-2, report
    assert len(reports) == world - servers
    assert all(report["autotune"] == reports[0]["autotune"] for report in reports)
    start = reports[0]["autotune"]["history"][0]
    assert start["default"]
    partition = start["options"]["partition_bytes"]
    assert start["options"]["credit_bytes"] == CREDIT_SLICES * partition
    assert MIN_PARTITION <= partition <= MAX_PARTITION
    assert 4 * math.log2(partition) == pytest.approx(round(4 * math.log2(partition)), abs=1e-3)  # whole bytes
