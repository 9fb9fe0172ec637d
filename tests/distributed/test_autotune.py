"""Online autotuning with real processes: every rank switches plans at the same steps, the
candidates are the seeded tuner's, and the kept options are never slower than the start."""

from __future__ import annotations

import json

import pytest

from gradsched.tune import Tuner, default_space
from launch import run_ranks


@pytest.mark.parametrize("world,servers", [(2, 0), (3, 1)])
def test_online_autotune_switches_together_and_keeps_the_best(tmp_path, world, servers):
    out = tmp_path / "out.json"
    results = run_ranks("autotune.py", world, str(out), "--servers", str(servers), timeout=180)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    reports = json.loads(out.read_text())
    assert len(reports) == world - servers
    first = reports[0]
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
    # the seeded tuner, told the same times offline, proposes the same candidates: the first
    # four from its start-up phase, the last two from its Gaussian-process model
    space = default_space("bytescheduler", {"partition_bytes": "1KiB:64KiB", "credit_bytes": "4KiB:256KiB"})
    tuner = Tuner(space, seed=7, start={"partition_bytes": 4096, "credit_bytes": 16384})
    expected = []
    for h in history:
        candidate = tuner.ask()
        expected.append(candidate.options)
        tuner.tell(candidate, h["iteration_s"])
    assert [h["options"] for h in history] == expected
    # the kept options: the starting ones unless the confirmed candidate (measured twice:
    # its arm and the confirming one) beat them by 2% on the mean of its arms
    confirm = tuning["confirm"]
    assert confirm is not None and confirm["options"] in [h["options"] for h in history]
    times: dict[str, list[float]] = {}
    for h in history:
        times.setdefault(json.dumps(h["options"], sort_keys=True), []).append(h["iteration_s"])
    times[json.dumps(confirm["options"], sort_keys=True)].append(confirm["iteration_s"])
    means = {k: sum(v) / len(v) for k, v in times.items()}
    start = json.dumps(history[0]["options"], sort_keys=True)
    confirmed = json.dumps(confirm["options"], sort_keys=True)
    kept = confirmed if means[confirmed] < means[start] * 0.98 else start
    assert json.dumps(tuning["best_options"], sort_keys=True) == kept
    assert tuning["best_s"] == pytest.approx(means[kept]) and tuning["default_s"] == pytest.approx(means[start])
    assert tuning["best_s"] <= tuning["default_s"]
