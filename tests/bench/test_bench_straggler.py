"""One slow worker in the bench and the simulator (issue 58, part 2): how it is asked for,
checked, passed to the ranks, and what the bound and the predictions take for compute."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gradsched.bench.config import BenchConfig
from gradsched.bench.figures import figures
from gradsched.bench.protocol import WorkerConfig
from gradsched.bench.results import RankReport, RunReport
from gradsched.bench.straggler import Straggler
from gradsched.bench.worker import bursting
from gradsched.bench.workloads import Pacer, workload
from gradsched.cli import build_parser, main
from gradsched.cli_args import UsageError
from gradsched.core import MeasuredLink, policy_config
from gradsched.sim import link_cluster, predict, scaled
from gradsched.sim.cluster import LinkBursts


def _config(*argv: str) -> BenchConfig:
    from gradsched.bench.cli import config_from

    return config_from(build_parser().parse_args(["bench", *argv]))


def test_the_straggler_is_a_rank_and_a_factor_of_a_replayed_worker():
    assert _config("--model", "replay-mini", "--straggler", "1:1.5").straggler == Straggler(1, 1.5)
    assert _config("--model", "replay-mini").straggler is None
    with pytest.raises(UsageError, match="RANK:FACTOR"):
        _config("--model", "replay-mini", "--straggler", "slow")
    for straggler, message in [(Straggler(1, 1.5), "choose a replay model"), (Straggler(2, 1.5), r"a rank in 0\.\.1")]:
        with pytest.raises(ValueError, match=message):
            BenchConfig(model="mlp" if message.startswith("choose") else "replay-mini", straggler=straggler)
    with pytest.raises(ValueError, match="must be > 1"):
        Straggler(1, 1.0)


@pytest.mark.parametrize("text, expected", [
    ("1:1.5:link", Straggler(1, 1.5, link=True)),
    ("0:2:burst=1/4", Straggler(0, 2.0, slow=1, period=4)),
    ("1:3:burst=3/8", Straggler(1, 3.0, slow=3, period=8)),
    ("1:3:link:burst=100ms/0.4s", Straggler(1, 3.0, link=True, slow_s=0.1, period_s=0.4)),
])
def test_a_straggler_slows_its_link_or_computes_slower_in_bursts(text, expected):
    parsed = _config("--model", "replay-mini", "--iters", "8", "--straggler", text).straggler
    assert parsed == expected
    assert Straggler.from_json(json.loads(json.dumps(parsed.as_json()))) == parsed


@pytest.mark.parametrize("text, message", [
    ("1:1.5:fast", "neither 'link' nor"), ("1:1.5:link:link", "repeats"), ("1:2:burst=4/4", "0 < SLOW < PERIOD"),
    ("1:2:burst=0/4", "0 < SLOW < PERIOD"), ("1:2:link:burst=1/4", "by the clock"),
    ("1:2:burst=10ms/40ms", "whole steps"), ("1:2:link:burst=40ms/40ms", "0 < SLOW < PERIOD"),
    ("1:2:link:burst=10/40ms", "durations"),
    ("1:0.5:link", "must be > 1"), ("1:2:burst=1/3", "whole number of periods"),
])
def test_bad_stragglers_are_refused_with_the_reason(text, message):
    with pytest.raises(UsageError if "whole number" not in message else ValueError, match=message):
        _config("--model", "replay-mini", "--iters", "8", "--straggler", text)


def test_a_slower_link_needs_no_replay_but_a_shaped_link():
    assert BenchConfig(model="mlp", straggler=Straggler(1, 2.0, link=True)).straggling == 1.0  # computes as the others
    link, bursts = Straggler(1, 2.0, link=True), Straggler(1, 2.0, link=True, slow_s=0.1, period_s=0.4)
    for straggler, settings, message in [
        (link, {"loopback": True}, "tc-limited link"), (bursts, {"bandwidths_bps": (1e9, None)}, "tc-limited link"),
        (bursts, {"arch": "ps", "servers": 1, "policies": ("fifo",)}, "without --arch ps"),
    ]:
        with pytest.raises(ValueError, match=message):
            BenchConfig(model="replay-mini", straggler=straggler, iters=4, **settings)


def test_on_hosts_of_several_ranks_a_slower_link_is_its_hosts_shared_by_its_ranks():
    config = BenchConfig(model="replay-mini", workers=4, procs_per_node=2, iters=4,
                         straggler=Straggler(3, 2.0, link=True, slow_s=0.1, period_s=0.4))
    assert config.straggler.host(config.procs_per_node) == 1 and Straggler(1, 2.0, link=True).host(2) == 0
    assert config.straggler.describe(2) == "host 1's link (its 2 ranks share it) is 2x slower for 100 ms of every 400 ms"
    assert Straggler(1, 1.5).describe(2) == "rank 1 computes 1.5x slower"  # a compute straggler is its own


def test_each_rank_builds_its_replay_with_its_own_steady_factor():
    steady, link, bursts = Straggler(1, 1.5), Straggler(1, 1.5, link=True), Straggler(1, 2.0, slow=1, period=4)
    assert [steady.compute_factor(r) for r in (0, 1)] == [1.0, 1.5]
    assert [link.compute_factor(r) for r in (0, 1)] == [1.0, 1.0]
    assert [bursts.compute_factor(r) for r in (0, 1)] == [1.0, 1.0]  # paced step by step instead
    assert bursts.mean_factor == pytest.approx(1.25)


def test_own_plans_turn_planning_on_the_slow_rank_off_in_every_gradsched_run():
    from gradsched.bench.launch import payload

    assert _config("--model", "replay-mini", "--straggler", "1:1.5").plan_on_slow_rank is True
    config = _config("--model", "replay-mini", "--straggler", "1:1.5", "--own-plans")
    assert config.plan_on_slow_rank is False
    assert WorkerConfig.from_json(payload(config, None, None)).plan_on_slow_rank is False


def test_every_rank_is_told_the_straggler():
    for straggler in (Straggler(1, 2.0), Straggler(1, 2.0, link=True), Straggler(0, 3.0, slow=2, period=5)):
        config = WorkerConfig("replay-mini", 32, "v100", 3, 1, (), 3, True, straggler=straggler)
        assert WorkerConfig.from_json(config.to_json()) == config


def test_runs_kept_before_bursts_and_links_read_as_steady_compute_stragglers():
    assert Straggler.from_json([1, 1.5]) == Straggler(1, 1.5) and Straggler.from_json(None) is None


def test_a_burst_straggler_paces_the_steps_its_bursts_name():
    """The worker's step wrapper (gradsched.bench.worker.bursting) on a real pacer: ops in the
    slow steps take the factor times their time."""
    pacer = Pacer(quantum=1.0, sleep=lambda s: None)  # nothing slept: the paced time is what is counted
    op_s = 1e-3
    step = bursting(lambda: pacer.wait(op_s), pacer, Straggler(1, 3.0, slow=2, period=5))
    paced = []
    for _ in range(10):
        before = pacer.busy_s
        step()
        paced.append(pacer.busy_s - before)
    assert paced == pytest.approx([3 * op_s] * 2 + [op_s] * 3 + [3 * op_s] * 2 + [op_s] * 3)


def _raw(compute: list[float], times: list[float]) -> RankReport:
    return RankReport(compute=compute, comm=[0.050] * 3, latency=1e-4, overhead=5e-5, gradient_bytes=1 << 20,
                      world_size=2, policies={"fifo": RunReport(times, plan="fifo")})


def test_the_bound_and_predictions_take_the_slow_ranks_compute():
    """Rank 0 reports its own compute-only time: a fast rank's, unless it is the straggler."""
    raw = _raw([0.100] * 3, [0.2] * 3)
    computes = {}
    for straggler in (None, Straggler(1, 1.5), Straggler(0, 1.5), Straggler(1, 1.5, link=True)):
        config = BenchConfig(model="replay-mini", policies=("fifo",), straggler=straggler)
        setting = figures(config, 1e9, True, raw)
        computes[straggler] = setting.compute_s
        assert setting.rows[0].predicted_s > 0
    assert computes == {None: pytest.approx(0.100), Straggler(1, 1.5): pytest.approx(0.150),
                        Straggler(0, 1.5): pytest.approx(0.100), Straggler(1, 1.5, link=True): pytest.approx(0.100)}


@pytest.mark.parametrize("rank", [0, 1])
def test_bursts_are_counted_as_they_come_mean_compute_mean_bound_mean_iteration(rank):
    """1 slow iteration (2x) in every 4: compute, bound, row and prediction are the means over
    the iterations; rank 0's compute times are the slow rank's own where it is the straggler."""
    bursts = Straggler(rank, 2.0, slow=1, period=4)
    config = BenchConfig(model="replay-mini", policies=("fifo",), iters=4, straggler=bursts)
    compute = [0.08, 0.04, 0.04, 0.04] if rank == 0 else [0.04] * 4  # rank 0 the straggler: its own bursts
    setting = figures(config, 1e9, True, _raw(compute, [0.3, 0.1, 0.1, 0.1]))
    assert setting.modes == [(0.75, pytest.approx(0.04)), (0.25, pytest.approx(0.08))]
    assert setting.compute_s == pytest.approx(0.75 * 0.04 + 0.25 * 0.08)
    assert setting.bound_s == pytest.approx(0.75 * 0.05 + 0.25 * 0.08)  # each iteration's max(compute, 50 ms comm)
    row = setting.rows[0]
    assert row.iteration_s == pytest.approx(0.15)  # the mean, not the median (0.1)
    steady = {c: figures(BenchConfig(model="replay-mini", policies=("fifo",), iters=4), 1e9, True,
                         _raw([c] * 4, [0.1] * 4)).rows[0].predicted_s for c in (0.04, 0.08)}
    assert row.predicted_s == pytest.approx(0.75 * steady[0.04] + 0.25 * steady[0.08])
    assert setting.dependency_bound_s is not None


def test_a_link_in_bursts_is_measured_by_its_mean_over_the_clock():
    """A link 3x slower for 1 s of every 2 s: communication alone is the mean of its rounds (its
    rate averaged over the clock), the bound max(compute, that), the rows means, each with the
    periods its timed window lasted; the prediction is the simulator's on the fast link with the
    same bursts (gradsched.sim.cluster.LinkBursts), which averages to the link measured."""
    bursts = Straggler(1, 3.0, link=True, slow_s=1.0, period_s=2.0)
    assert bursts.rate_share == pytest.approx(0.5 + 0.5 / 3)
    config = BenchConfig(model="replay-mini", policies=("fifo",), iters=4, straggler=bursts)
    raw = dataclasses.replace(_raw([0.1] * 4, [0.4, 0.1, 0.4, 0.1]), comm=[0.15, 0.05, 0.05, 0.15, 0.05])
    setting = figures(config, 1e9, True, raw)
    assert setting.comm_s == pytest.approx(0.09) and setting.bound_s == pytest.approx(0.1)  # not the median 0.05
    row = setting.rows[0]
    assert row.iteration_s == pytest.approx(0.25) and row.periods == pytest.approx(0.5)
    assert row.as_json(False)["periods"] == pytest.approx(0.5)
    plain = dataclasses.replace(_raw([0.1] * 4, [0.1] * 4), comm=[0.09 * bursts.rate_share] * 3)  # the fast link
    steady = figures(BenchConfig(model="replay-mini", policies=("fifo",), iters=4), 1e9, True, plain)
    assert "periods" not in steady.rows[0].as_json(False)
    table = scaled(workload("replay-mini", 32, "v100").table, 0.1)
    fast = link_cluster(MeasuredLink(1e-4, 5e-5, 0.09 * bursts.rate_share / (1 << 20)), 2)
    expected = predict(table, dataclasses.replace(fast, bursts=LinkBursts(3.0, 1.0, 2.0)), policy_config("fifo"))
    assert row.predicted_s == pytest.approx(expected)
    assert steady.rows[0].predicted_s == pytest.approx(predict(table, fast, policy_config("fifo")))
    assert row.predicted_s > steady.rows[0].predicted_s * 1.05  # the bursts cost the link-bound rows


def test_a_dilated_runs_ranks_report_is_undilated_with_its_times():
    report = RunReport([0.3], ranks={"backward_s": [0.3, None, 0.6], "median_s": 0.45, "slow_rank": 2, "ratio": 1.33})
    ranks = report.undilated(3).ranks
    assert ranks["backward_s"] == [pytest.approx(0.1), None, pytest.approx(0.2)]
    assert ranks["median_s"] == pytest.approx(0.15) and ranks["slow_rank"] == 2
    # the ring probe's transfers (3+ ranks) too; runs kept before it have none
    linked = RunReport([0.3], ranks={"backward_s": [0.3, 0.3, 0.3], "median_s": 0.3, "slow_rank": None, "ratio": 1.0,
                                     "link_out_s": [0.03, 0.12, 0.12], "link_median_s": 0.03, "link_rank": 2,
                                     "link_ratio": 4.0}).undilated(3).ranks
    assert linked["link_out_s"] == [pytest.approx(0.01), pytest.approx(0.04), pytest.approx(0.04)]
    probed = RunReport([0.3], ranks={"backward_s": [0.3] * 3, "median_s": 0.3, "slow_rank": None, "ratio": 1.0,
                                     "link_probes": [[0.03, 0.06], [0.03, 0.12], [0.03, 0.12]]}).undilated(3).ranks
    assert probed["link_probes"] == [[pytest.approx(0.01), pytest.approx(0.02)],
                                     [pytest.approx(0.01), pytest.approx(0.04)], [pytest.approx(0.01), pytest.approx(0.04)]]
    assert linked["link_median_s"] == pytest.approx(0.01) and linked["link_ratio"] == 4.0


def test_the_bench_says_which_rank_it_named_and_how():
    from gradsched.bench.report import named_slow

    assert named_slow(None) == "" and named_slow({"slow_rank": None}) == ""
    assert named_slow({"slow_rank": 1, "ratio": 1.5}) == "rank 1 (1.50x)"
    assert named_slow({"slow_rank": None, "burst_rank": 1, "burst_rounds": 5, "burst_of": 23, "burst_slowest_s": 0.4,
                       "median_s": 0.2}) == "rank 1 in bursts (5 of 23 rounds, up to 2.00x)"
    assert named_slow({"slow_rank": None, "link_rank": 2, "link_ratio": 3.9}) == "rank 2's link (3.90x)"
    assert named_slow({"slow_rank": None, "link_burst_rank": 1, "link_burst_probes": 2, "link_probes_of": 4,
                       "link_burst_ratio": 1.98}) == "rank 1's link in bursts (2 of 4 probes, up to 1.98x)"
    assert named_slow({"slow_rank": None, "link_rank": 1, "link_ratio": 2.0, "ranks_per_host": 2}) == \
        "host 1's link (ranks 2-3) (2.00x)"


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


def test_simulate_runs_a_ring_at_the_slow_links_pace(capsys):
    setting = ["simulate", "--model", "resnet50", "--workers", "8", "--policy", "fifo,prophet", "--iterations", "8",
               "--json"]
    assert main(setting + ["--bandwidth", "10Gbit", "--straggler", "2:link"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert main(setting + ["--bandwidth", "5Gbit"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert [r["iteration_s"] for r in slow["results"]] == pytest.approx([r["iteration_s"] for r in plain["results"]])
    assert slow["model"] == "resnet50 (one worker's link 2x slower)" and plain["model"] == "resnet50"
    for extra, message in ((["--straggler", "2:disk"], "FACTOR, FACTOR:link or FACTOR:link:burst=SLOW/PERIOD"),
                           (["--straggler", "2:link", "--arch", "ps"], "not --arch ps")):
        assert main(setting + ["--bandwidth", "10Gbit", *extra]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.slow  # CI: the smoke run keeps the bench working; the straggler's parts are tested above, one by one
@pytest.mark.parametrize("straggler, hosts", [("1:3:link", []), ("1:3:burst=1/2", []),
                                              ("1:3:link:burst=50ms/100ms", []),
                                              ("3:3:link", ["--nodes", "2", "--procs-per-node", "2"])])
def test_a_bench_run_with_a_slower_link_or_a_straggler_in_bursts(straggler, hosts):
    """Real ranks on the emulated cluster: a link 3x slower makes communication alone about
    3x as long as the link's share of the same run without it (on hosts of two ranks: the
    second host's link, which the ring crosses into it and out of it); bursts (every other
    iteration 3x slower, so the mean compute 2x) raise compute alone to about twice rank 0's own."""
    import subprocess
    import sys

    from netns_helpers import HAVE_NETNS

    if not HAVE_NETNS:
        pytest.skip("no network namespaces here")
    runs = {}
    for extra in ([], ["--straggler", straggler]):
        out = subprocess.run([sys.executable, "-m", "gradsched", "bench", "--model", "replay-mini", "--bandwidth",
                              "1Gbit", "--iters", "4", "--warmup", "1", "--policy", "ddp,prophet", "--json", *hosts,
                              *extra],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[bool(extra)] = json.loads(out.stdout)
    plain, slow = runs[False]["settings"][0], runs[True]["settings"][0]
    assert Straggler.from_json(runs[True]["straggler"]) == Straggler.parse(straggler)
    if straggler.endswith("link"):
        assert 2.5 < slow["comm_s"] / plain["comm_s"] < 3.5
        assert slow["compute_s"] == pytest.approx(plain["compute_s"], rel=0.2)
    elif "link" in straggler:  # half the time at a third of the rate: 2/3 of it on average, comm 1.5x
        assert 1.2 < slow["comm_s"] / plain["comm_s"] < 1.8
        assert slow["compute_s"] == pytest.approx(plain["compute_s"], rel=0.2)
        assert all(r["periods"] > 4 for r in runs[True]["results"])
    else:
        assert slow["compute_modes"] is not None and 1.7 < slow["compute_s"] / plain["compute_s"] < 2.3
    assert all(r["predicted_s"] for r in runs[True]["results"] if r["policy"] == "prophet")
