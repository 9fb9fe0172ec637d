"""benchmarks/scaling.py: iteration time against worker count, beside the simulator's curve."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("scaling", ROOT / "benchmarks" / "scaling.py")
scaling = importlib.util.module_from_spec(spec)
sys.modules["scaling"] = scaling  # (its dataclasses look their module up)
spec.loader.exec_module(scaling)

RUN = str(ROOT / "docs" / "figures" / "bench-straggler-none-resnet50-k3.json")  # 2 workers, at their balance point


def test_a_ring_moves_two_n_minus_one_over_n_of_the_gradients_per_worker():
    assert [scaling.ring_share(n) for n in (2, 4, 8, 16)] == [1.0, 1.5, 1.75, 1.875]


def test_measured_counts_are_simulated_on_their_own_link_and_others_at_their_balance_point(capsys):
    points = scaling.points([RUN], batch=96, extra=[8])
    two, eight = points
    assert two.workers == 2 and set(two.measured_s) == {"ddp", "bytescheduler", "prophet"}
    for policy, measured in two.measured_s.items():  # the simulator follows each run within 10% here
        assert two.simulated_s[policy] == pytest.approx(measured, rel=0.10), policy
    assert eight.measured_s == {} and set(eight.simulated_s) == set(two.simulated_s)
    assert eight.bandwidth_gbps == pytest.approx(two.bandwidth_gbps * 1.75)  # the 8 workers' balance point
    text = scaling.table(points)
    assert text.splitlines()[3].startswith("| 8 | 5.43 | - | - | 264 | (")


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        scaling.main([RUN, "--predict", "sixteen"])
    assert "--predict must be worker counts" in capsys.readouterr().err


def test_a_policy_that_fell_back_is_marked_and_simulated_as_the_buckets():
    run = str(ROOT / "docs" / "figures" / "bench-scaling-resnet50-8w-k13.json")  # prophet lost its trial there
    (eight,) = scaling.points([run], batch=96, extra=[])
    assert eight.fell_back == {"prophet"}
    assert eight.simulated_s["prophet"] == pytest.approx(eight.simulated_s["ddp"])  # both the 25 MiB buckets
    row = scaling.table([eight]).splitlines()[2]
    assert row.endswith("0.85x* |") and "the measured trial chose DDP-style buckets" in scaling.table([eight])
