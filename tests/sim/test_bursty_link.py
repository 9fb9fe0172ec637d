"""A link slower in bursts by the clock (gradsched.sim.cluster.LinkBursts): each message's
bytes at the rate of the phase they move in, hand-computed; the bound and the prediction at
the rate averaged over the clock; ``gradsched simulate --straggler F:link:burst=S/P``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from gradsched.cli import main
from gradsched.core.policies import FifoConfig
from gradsched.models.table import Layer, ModelTable, ParamSpec
from gradsched.sim import Cluster, predict, simulate
from gradsched.sim.cluster import LinkBursts
from gradsched.sim.fsdp import fsdp_iteration_s
from gradsched.sim.network import make_network
from gradsched.sim.predict import link_bursts

MB_PER_S = 8e6  # bandwidth_bps of 1 MB/s: 2 workers' ring moves a payload byte in 1 us


def test_a_message_across_the_phases_moves_at_each_phases_rate():
    """2x slower for 1 s of every 2 s from t=0; 1.5 s of bytes at the fast rate, after 0.1 s of
    overhead, from t=0.5: 0.2 s of work in 0.6-1.0 (slow), 1.0 s in 1.0-2.0 (fast), the last
    0.3 s slow again, 2.0-2.6; done one latency later."""
    cluster = Cluster(workers=2, bandwidth_bps=MB_PER_S, latency_s=0.05, overhead_s=0.1,
                      bursts=LinkBursts(2.0, 1.0, 2.0))
    net = make_network(cluster)
    first = net.submit(1_500_000, 0.5)
    assert (first.segments[0].start, first.segments[0].end, first.complete) == pytest.approx((0.5, 2.6, 2.65))
    queued = net.submit(500_000, 0.0)  # behind it: 2.6-2.7 overhead, 0.3 s of the slow phase's work in 2.7-3.0, fast
    assert queued.segments[0].end == pytest.approx(3.0 + 0.5 - 0.15)


def test_without_bursts_or_in_a_fast_phase_nothing_changes():
    steady = make_network(Cluster(workers=2, bandwidth_bps=MB_PER_S, latency_s=0.0))
    bursty = make_network(Cluster(workers=2, bandwidth_bps=MB_PER_S, latency_s=0.0,
                                  bursts=LinkBursts(3.0, 1.0, 4.0, offset_s=-2.0)))  # slow 2-3, 6-7, ...
    assert steady.submit(1_000_000, 0.5).complete == bursty.submit(1_000_000, 0.5).complete == 1.5


@settings(max_examples=200, deadline=None)
@given(start=st.floats(-10, 10), a=st.floats(0, 5), b=st.floats(0, 5), factor=st.floats(1.01, 10),
       slow=st.floats(0.01, 0.99), offset=st.floats(-3, 3))
def test_work_adds_up_and_takes_between_the_fast_and_the_slow_time(start, a, b, factor, slow, offset):
    bursts = LinkBursts(factor, slow, 1.0, offset)
    after_a = bursts.finish(start, a)
    assert a - 1e-9 <= after_a - start <= a * factor + 1e-9
    assert bursts.finish(after_a, b) == pytest.approx(bursts.finish(start, a + b), abs=1e-9)


def test_over_whole_periods_the_link_moves_at_its_rate_averaged_over_the_clock():
    bursts = LinkBursts(2.0, 0.2, 0.4)
    assert bursts.rate_share == pytest.approx(0.75) and bursts.mean_factor == pytest.approx(4 / 3)
    assert bursts.finish(0.0, 0.3 * 10) == pytest.approx(4.0)  # 10 periods: 0.1 s slow + 0.2 s fast of work each
    net = make_network(Cluster(workers=2, bandwidth_bps=MB_PER_S, latency_s=0.0, bursts=bursts))
    ends = [net.submit(10_000, 0.0).complete for _ in range(1000)]  # 10 s of the fast link's work
    assert ends[-1] == pytest.approx(10 * 4 / 3, abs=0.4)


def test_the_bound_is_at_the_rate_averaged_over_the_clock_and_bursts_need_a_ring():
    cluster = Cluster(workers=2, bandwidth_bps=MB_PER_S, bursts=LinkBursts(2.0, 0.2, 0.4))
    assert cluster.comm_time(1_000_000) == pytest.approx(4 / 3) and cluster.mean_factor == pytest.approx(4 / 3)
    assert "2x slower for 200 ms of every 400 ms" in cluster.describe()
    with pytest.raises(ValueError, match="rings"):
        Cluster(workers=2, arch="ps", bursts=LinkBursts(2.0, 0.2, 0.4))
    for bad in (dict(factor=1.0, slow_s=0.1, period_s=1.0), dict(factor=2.0, slow_s=1.0, period_s=1.0),
                dict(factor=2.0, slow_s=0.0, period_s=1.0), dict(factor=2.0, slow_s=0.1, period_s=1.0,
                                                              offset_s=float("nan"))):
        with pytest.raises(ValueError, match="bursts"):
            LinkBursts(**bad)
    with pytest.raises(ValueError, match="steady link"):
        fsdp_iteration_s(_table(1e-3), replace(cluster, arch="sharded"))


def _table(compute_s: float, layers: int = 8, elements: int = 250_000) -> ModelTable:
    """``layers`` layers of ``elements`` each but the first (what is sent after the backward
    pass), of 250."""
    return ModelTable("m", tuple(Layer(f"l{i}", compute_s / layers / 3, 2 * compute_s / layers / 3,
                                       (ParamSpec(f"l{i}.w", elements if i else 250),)) for i in range(layers)))


def test_predictions_on_bursts_where_the_link_decides_and_where_it_does_not():
    """7 MB of gradients, 7 s of the fast link's time (1 MB/s): with 1 ms of compute the link
    decides and the iteration is its time at the rate averaged over the clock (bursts of 1 s in
    4 s, 3x slower: 1.5x the fast time); with a compute of 100 s behind which the link hides (but
    the first layer's 1 kB, sent after it), bursts change nothing."""
    bursts = LinkBursts(3.0, 1.0, 4.0)
    cluster = Cluster(workers=2, bandwidth_bps=MB_PER_S, latency_s=0.0)
    fifo = FifoConfig(bucket_cap_bytes=1, first_bucket_bytes=1)  # each gradient as it comes
    link_bound = predict(_table(1e-3), replace(cluster, bursts=bursts), fifo)
    assert link_bound == pytest.approx(7.0 * bursts.mean_factor, rel=0.03)
    hidden = _table(100.0)
    assert predict(hidden, replace(cluster, bursts=bursts), fifo) == pytest.approx(predict(hidden, cluster, fifo),
                                                                                  rel=1e-3)


def test_link_bursts_names_the_table_and_refuses_parameter_servers():
    named, bursty = link_bursts(_table(1.0), Cluster(workers=4), 2.0, 0.1, 1.0)
    assert named.name == "m (one worker's link 2x slower for 100 ms of every 1 s)"
    assert bursty.bursts == LinkBursts(2.0, 0.1, 1.0)
    with pytest.raises(ValueError, match="parameter servers"):
        link_bursts(_table(1.0), Cluster(workers=4, arch="ps"), 2.0, 0.1, 1.0)


def test_simulate_runs_a_ring_slower_in_bursts(capsys):
    setting = ["simulate", "--model", "resnet50", "--workers", "4", "--bandwidth", "5Gbit", "--policy", "fifo,prophet",
               "--iterations", "20", "--json"]
    runs = {}
    for name, extra in (("fast", []), ("bursts", ["--straggler", "2:link:burst=200ms/400ms"]),
                        ("slow", ["--straggler", "2:link"])):
        assert main(setting + extra) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["bursts"]["model"] == "resnet50 (one worker's link 2x slower for 200 ms of every 400 ms)"
    for fast, bursty, slow in zip(*(runs[n]["results"] for n in ("fast", "bursts", "slow"))):
        assert bursty["bound_s"] == pytest.approx(fast["bound_s"] * 4 / 3, rel=1e-6) or \
            bursty["bound_s"] == pytest.approx(bursty["compute_s"])
        assert fast["iteration_s"] < bursty["iteration_s"] < slow["iteration_s"]
    for bad, message in (("2:link:burst=200ms", "FACTOR:link:burst=SLOW/PERIOD"),
                         ("2:burst=1/4", "FACTOR:link:burst=SLOW/PERIOD"),
                         ("2:link:burst=400ms/200ms", "0 < SLOW < PERIOD"),
                         ("2:link:burst=2x/4s", "durations")):
        assert main(setting + ["--straggler", bad]) == 2
        assert message in capsys.readouterr().err
    assert main(setting + ["--straggler", "2:link:burst=1s/2s", "--arch", "ps"]) == 2
    assert "not --arch ps" in capsys.readouterr().err


def test_simulated_policies_size_their_messages_on_the_rate_averaged_over_the_clock():
    table = _table(1.0, elements=2_500_000)  # 70 MB
    cluster = Cluster(workers=2, bandwidth_bps=100 * MB_PER_S, latency_s=1e-5, overhead_s=1e-4)
    bursty = replace(cluster, bursts=LinkBursts(3.0, 0.9, 1.0))  # 2.5x slower on average
    mean = replace(cluster, bandwidth_bps=cluster.bandwidth_bps * bursty.bursts.rate_share)
    ours = simulate(table, bursty, "bytescheduler", iterations=4, record=False).config
    assert ours == simulate(table, mean, "bytescheduler", iterations=4, record=False).config
    assert ours != simulate(table, cluster, "bytescheduler", iterations=4, record=False).config
