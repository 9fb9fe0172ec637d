"""Time dilation (gradsched.bench.dilation): what a dilated run reports, how auto picks K, what
is refused; the replay runs K times slower; and, on the emulated cluster, communication alone
and a DDP run measured at K=1 and K=3 agree once divided by K."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from gradsched.bench.dilation import AUTO_CPU_SHARE, AUTO_RUN_SHARE, auto_dilation, check_dilation, raised_dilation
from gradsched.bench.results import RankReport, RunReport
from gradsched.bench.config import BenchConfig
from gradsched.bench.workloads import workload

from netns_helpers import needs_netns


def test_every_time_of_a_run_is_divided_by_k():
    raw = {"compute": [0.3, 0.6], "comm": [0.9], "comm_servers": [1.2], "latency": 3e-3, "overhead": 6e-3,
           "cast_s_per_byte": 3e-9, "gradient_bytes": 1000, "world_size": 2, "host_cpu": {"ddp": 0.4},
           "policies": {"ddp": {"times": [1.5, 3.0], "bucket_cap_mb": 25},
                        "prophet": {"times": [0.9], "plan": "prophet",
                                    "prediction": {"policy_s": 0.6, "fifo_s": 0.9, "separable": True},
                                    "trial": {"policy_s": 0.3, "fifo_s": 0.6, "use_fifo": False},
                                    "autotune": {"best_s": 0.3, "default_s": None, "best_options": {"a": 3},
                                                 "confirm": {"options": {"a": 3}, "iteration_s": 0.9}}}}}
    report = RankReport.from_json(raw)
    out = report.undilated(3.0)
    assert out.compute == pytest.approx([0.1, 0.2]) and out.comm == pytest.approx([0.3])
    assert out.comm_servers == pytest.approx([0.4]) and out.comm_wire is None
    assert (out.latency, out.overhead, out.cast_s_per_byte) == pytest.approx((1e-3, 2e-3, 1e-9))
    assert (out.gradient_bytes, out.world_size, out.host_cpu) == (1000, 2, {"ddp": 0.4})  # not times
    assert out.policies["ddp"] == RunReport(times=pytest.approx([0.5, 1.0]), bucket_cap_mb=25)
    prophet = out.policies["prophet"]
    assert prophet.times == pytest.approx([0.3]) and prophet.plan == "prophet"
    assert prophet.prediction == {"policy_s": pytest.approx(0.2), "fifo_s": pytest.approx(0.3), "separable": True}
    assert prophet.trial == {"policy_s": pytest.approx(0.1), "fifo_s": pytest.approx(0.2), "use_fifo": False}
    assert prophet.autotune["best_s"] == pytest.approx(0.1) and prophet.autotune["default_s"] is None
    assert prophet.autotune["confirm"] == {"options": {"a": 3}, "iteration_s": pytest.approx(0.3)}
    assert report.comm == [0.9] and report.policies["prophet"].trial["policy_s"] == 0.3  # the input is kept
    assert report.undilated(1.0) is report


@pytest.mark.parametrize("busy, k", [(None, 1), (0.1, 1), (AUTO_CPU_SHARE, 1), (0.36, 2), (0.7, 2), (0.71, 3),
                                     (1.0, 3), (50.0, 20)])
def test_auto_picks_the_smallest_k_under_the_stated_share(busy, k):
    assert auto_dilation(busy) == k


@pytest.mark.parametrize("dilation, replay, match", [
    (0.5, True, "a factor in 1..20"), (21, True, "a factor in 1..20"), ("3", True, "a factor"), (True, True, "factor"),
    (3.0, False, "real models compute at the CPU's own speed"), ("auto", False, "cannot be slowed down"),
])
def test_bad_dilations_are_refused(dilation, replay, match):
    with pytest.raises(ValueError, match=match):
        check_dilation(dilation, replay)


def test_the_bench_config_refuses_dilating_a_real_model():
    with pytest.raises(ValueError, match="real models"):
        BenchConfig(model="mlp", dilation=2.0)
    BenchConfig(model="replay-mini", dilation=2.0)
    BenchConfig(model="replay-mini", dilation="auto")


def _replayed(k: float) -> tuple[float, float]:
    """(wall seconds, device seconds the pacer paced) of three backward passes of replay-mini at ``k``."""
    work = workload("replay-mini", dilation=k)
    model = work.build()
    x, y = work.batch(torch.Generator())
    start = time.perf_counter()
    for _ in range(3):
        work.loss(model(x), y).backward()
    return time.perf_counter() - start, model.pacer.busy_s


def test_a_dilated_replay_paces_k_times_the_device_time_and_waits_it_out():
    """Under any load: the device time paced at K=3 is 3x K=1's, and each run's wall time is at least
    what it paced (the waits are real sleeps; a busy host only lengthens them). The wall-clock ratio
    itself, which needs a quiet host: the slow test below."""
    (wall_1, paced_1), (wall_3, paced_3) = _replayed(1.0), _replayed(3.0)
    assert paced_3 == pytest.approx(3.0 * paced_1, rel=1e-9) and paced_1 > 0
    assert wall_1 >= paced_1 * 0.99 and wall_3 >= paced_3 * 0.99
    assert workload("replay-mini", dilation=3.0).table.compute_s == workload("replay-mini").table.compute_s


@pytest.mark.slow  # a wall-clock ratio: on a quiet host (the test above holds under load)
def test_a_dilated_replay_takes_k_times_as_long():
    plain = min(_replayed(1.0)[0] for _ in range(2))
    assert 2.5 * plain < _replayed(3.0)[0] < 3.6 * plain


def _bench(k: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gradsched", "bench", "--model", "replay-mini", "--bandwidth", "1Gbit",
         "--dilation", str(k), "--iters", "8", "--warmup", "2", "--policy", "ddp", "--json"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.slow  # CI: the unit tests above check the scaling of every reported time
@needs_netns
def test_communication_and_ddp_agree_at_k_1_and_3_divided_by_k():
    """At 1 Gbit/s replay-mini's communication keeps this host well under its CPUs (so K=1 is
    not CPU-bound): K=3 runs 3x slower links and compute and must report the same times."""
    plain, dilated = _bench(1), _bench(3)
    assert (plain["dilation"], dilated["dilation"]) == (1.0, 3.0)
    a, b = plain["settings"][0], dilated["settings"][0]
    assert a["host_cpu_busy_comm"] < 0.5
    assert b["comm_s"] == pytest.approx(a["comm_s"], rel=0.15)
    assert b["compute_s"] == pytest.approx(a["compute_s"], rel=0.25)
    ddp = [r["iteration_s"] for data in (plain, dilated) for r in data["results"] if r["policy"] == "ddp"]
    assert ddp[1] == pytest.approx(ddp[0], rel=0.15)
    wrong = 3 * a["comm_s"]  # what an undivided dilated run would report
    assert abs(b["comm_s"] - wrong) > abs(b["comm_s"] - a["comm_s"])


@pytest.mark.parametrize("k, busiest, raised", [(2, None, None), (2, AUTO_RUN_SHARE, None), (2, 0.75, 4),
                                                (3, 0.47, 4), (5, 0.43, None), (19, 0.9, 20), (20, 0.9, None)])
def test_auto_raises_k_while_the_dilated_runs_keep_the_host_too_busy(k, busiest, raised):
    """The runs themselves at K: the busiest over AUTO_RUN_SHARE raises K in proportion (busy
    falling as 1/K), by one at least, to 20 at most."""
    assert raised_dilation(k, busiest) == raised


def test_auto_calibrates_on_the_runs_themselves(monkeypatch):
    """The calibration sequence, with the host's shares given (the measurements are the bench's
    own elsewhere; this is the decision): communication alone 50% undilated starts at K=2; the
    runs at K=2 keep the host 75% busy, so K=4; at K=4 40%, so K=4 stays."""
    from gradsched.bench import calibration
    from gradsched.bench.protocol import COMM_ONLY
    from gradsched.bench.calibration import choose_dilation
    from gradsched.bench.config import BenchConfig

    ran = []

    def measured(config, bandwidth, progress, emulated=True, runs=None, iters=None):
        ran.append((float(config.dilation), tuple(runs) if runs is not None else None))
        base = dict(compute=[1.0], comm=[1.0], latency=1e-3, overhead=1e-3, gradient_bytes=1, world_size=2)
        if runs == ():
            return RankReport(**base, host_cpu={COMM_ONLY: 0.5})
        return RankReport(**base, host_cpu={"ddp": 0.3, "prophet": {2.0: 0.75, 4.0: 0.40}[float(config.dilation)]})

    monkeypatch.setattr(calibration, "measure", measured)
    config = BenchConfig(model="replay-mini", dilation="auto", policies=("ddp", "prophet"), bandwidths_bps=(1e9,))
    chosen, busy, history = choose_dilation(config)
    assert chosen.dilation == 4.0 and busy == 0.5
    assert ran == [(1.0, ()), (2.0, None), (4.0, None)]
    assert history == [{"dilation": 2, "host_cpu_busy_busiest_run": 0.75},
                       {"dilation": 4, "host_cpu_busy_busiest_run": 0.40}]
