"""One slow worker in the bench and the simulator (issue 58, part 2): how it is asked for,
checked, passed to the ranks, and what the bound and the predictions take for compute."""

from __future__ import annotations

import json

import pytest

from gradsched.bench.config import BenchConfig
from gradsched.bench.figures import figures
from gradsched.bench.protocol import WorkerConfig
from gradsched.bench.results import RankReport, RunReport
from gradsched.cli import build_parser, main
from gradsched.cli_args import UsageError


def _config(*argv: str) -> BenchConfig:
    from gradsched.bench.cli import config_from

    return config_from(build_parser().parse_args(["bench", *argv]))


def test_the_straggler_is_a_rank_and_a_factor_of_a_replayed_worker():
    assert _config("--model", "replay-mini", "--straggler", "1:1.5").straggler == (1, 1.5)
    assert _config("--model", "replay-mini").straggler is None
    with pytest.raises(UsageError, match="RANK:FACTOR"):
        _config("--model", "replay-mini", "--straggler", "slow")
    for straggler, message in [((1, 1.5), "choose a replay model"), ((2, 1.5), r"a rank in 0\.\.1"),
                               ((1, 1.0), "must be > 1")]:
        with pytest.raises(ValueError, match=message):
            BenchConfig(model="mlp" if message.startswith("choose") else "replay-mini", straggler=straggler)


def test_every_rank_is_told_the_straggler():
    config = WorkerConfig("replay-mini", 32, "v100", 3, 1, (), 3, True, straggler=(1, 2.0))
    assert WorkerConfig.from_json(config.to_json()) == config


def test_the_bound_and_predictions_take_the_slow_ranks_compute():
    """Rank 0 reports its own compute-only time: a fast rank's, unless it is the straggler."""
    raw = RankReport(compute=[0.100] * 3, comm=[0.050] * 3, latency=1e-4, overhead=5e-5, gradient_bytes=1 << 20,
                     world_size=2, policies={"fifo": RunReport([0.2] * 3, plan="fifo")})
    computes = {}
    for straggler in (None, (1, 1.5), (0, 1.5)):
        config = BenchConfig(model="replay-mini", policies=("fifo",), straggler=straggler)
        setting = figures(config, 1e9, True, raw)
        computes[straggler] = setting.compute_s
        assert setting.rows[0].predicted_s > 0
    assert computes == {None: pytest.approx(0.100), (1, 1.5): pytest.approx(0.150), (0, 1.5): pytest.approx(0.100)}


def test_a_dilated_runs_ranks_report_is_undilated_with_its_times():
    report = RunReport([0.3], ranks={"backward_s": [0.3, None, 0.6], "median_s": 0.45, "slow_rank": 2, "ratio": 1.33})
    ranks = report.undilated(3).ranks
    assert ranks["backward_s"] == [pytest.approx(0.1), None, pytest.approx(0.2)]
    assert ranks["median_s"] == pytest.approx(0.15) and ranks["slow_rank"] == 2


def test_simulate_runs_the_cluster_on_the_slow_workers_compute(capsys):
    setting = ["simulate", "--model", "resnet50", "--workers", "8", "--bandwidth", "10Gbit", "--policy", "fifo",
               "--iterations", "8", "--json"]
    results = {}
    for extra in ([], ["--straggler", "1.5"]):
        assert main(setting + extra) == 0
        results[bool(extra)] = json.loads(capsys.readouterr().out)["results"][0]
    assert results[True]["compute_s"] == pytest.approx(1.5 * results[False]["compute_s"])
    assert results[True]["iteration_s"] > results[False]["iteration_s"]
    assert main(setting + ["--straggler", "0.5"]) == 2
    assert "--straggler must be a factor > 1" in capsys.readouterr().err
