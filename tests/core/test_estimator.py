import pytest

from gradsched.core import LinkEstimator
from gradsched.sim import Cluster
from gradsched.sim.network import make_network


def feed(estimator, network, sizes, gap=0.0):
    """Launch messages back to back (or ``gap`` apart after each completion) on a simulated
    network and report them to the estimator as the engine would."""
    now, last_finish = 0.0, -1.0
    for i, size in enumerate(sizes):
        transfer = network.submit(size, now)
        isolated = gap > 0 or i == 0
        start = now if isolated else max(now, last_finish)
        estimator.observe(size, transfer.complete - start, isolated)
        last_finish = transfer.complete
        now = transfer.complete + gap if gap else now


def test_recovers_latency_and_bandwidth_of_all_reduce():
    cluster = Cluster(workers=4, bandwidth_bps=10e9, latency_s=80e-6)
    est = LinkEstimator()
    sizes = [1 << 16, 1 << 20, 1 << 18, 3 << 20, 1 << 14] * 4
    feed(est, make_network(cluster), sizes, gap=1e-3)  # isolated messages
    feed(est, make_network(cluster), sizes)  # a pipelined stream
    assert est.latency == pytest.approx(80e-6, rel=1e-6)
    assert est.seconds_per_byte == pytest.approx(cluster.seconds_per_byte, rel=1e-6)
    assert est.per_message == pytest.approx(0.0, abs=1e-9)


def test_push_pull_isolated_messages_pay_both_directions():
    cluster = Cluster(workers=4, bandwidth_bps=10e9, latency_s=50e-6, arch="ps", servers=2)
    est = LinkEstimator()
    sizes = [1 << 16, 1 << 20, 1 << 18, 3 << 19] * 4  # within the servers' first pieces (2 x 1 MiB)
    feed(est, make_network(cluster), sizes, gap=1e-3)
    # A two-stage pipeline paces a stream of equal messages exactly at one stage's rate
    # (with mixed sizes the queued samples overestimate it somewhat).
    feed(est, make_network(cluster), [1 << 20] * 16)
    assert est.latency == pytest.approx(2 * 50e-6, rel=1e-6)
    assert est.isolated_per_byte == pytest.approx(2 * cluster.seconds_per_byte, rel=1e-6)
    assert est.seconds_per_byte == pytest.approx(cluster.seconds_per_byte, rel=1e-6)


def test_follows_a_drifting_link():
    est = LinkEstimator(decay=0.9)
    for i in range(200):
        per_byte = 1e-9 if i < 100 else 4e-9  # bandwidth drops 4x halfway
        est.observe(1 << 20, (1 << 20) * per_byte, isolated=False)
        if i == 99:
            assert est.seconds_per_byte == pytest.approx(1e-9)
    assert est.seconds_per_byte == pytest.approx(4e-9, rel=1e-3)


def test_not_ready_until_observed():
    est = LinkEstimator()
    assert not est.ready and est.bytes_per_second == float("inf")
    est.observe(1000, 1e-3, isolated=True)
    assert est.ready and est.seconds_per_byte == pytest.approx(1e-6)
    with pytest.raises(ValueError):
        LinkEstimator(decay=0)
