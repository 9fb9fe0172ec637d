import pytest

from gradsched.sim import Cluster
from gradsched.sim.network import make_network


def test_all_reduce_alone_costs_alpha_plus_ring_bytes():
    cluster = Cluster(workers=4, bandwidth_bps=8e9, latency_s=1e-4)  # 1 GB/s
    net = make_network(cluster)
    t = net.submit(10**6, now=2.0)
    assert t.complete == pytest.approx(2.0 + 1e-4 + 2 * 3 / 4 * 1e-3)


def test_fifo_link_serialises_bytes_and_overlaps_latency():
    cluster = Cluster(workers=2, bandwidth_bps=8e6, latency_s=0.5)  # 1 MB/s, factor 1
    net = make_network(cluster)
    a = net.submit(10**6, 0.0)  # wire 0-1, done 1.5
    b = net.submit(10**6, 0.2)  # queued: wire 1-2, done 2.5
    c = net.submit(10**6, 3.0)  # idle link again: wire 3-4, done 4.5
    assert [(s.start, s.end) for t in (a, b, c) for s in t.segments] == [(0.0, 1.0), (1.0, 2.0), (3.0, 4.0)]
    assert [a.complete, b.complete, c.complete] == [1.5, 2.5, 4.5]


def test_push_then_pull_on_separate_directions():
    cluster = Cluster(workers=2, bandwidth_bps=8e6, latency_s=0.0, arch="ps", servers=2)  # factor max(1, 2/2)
    net = make_network(cluster)
    a = net.submit(10**6, 0.0)
    b = net.submit(10**6, 0.0)
    assert [(s.lane, s.start, s.end) for s in a.segments] == [("push", 0.0, 1.0), ("pull", 1.0, 2.0)]
    assert [(s.lane, s.start, s.end) for s in b.segments] == [("push", 1.0, 2.0), ("pull", 2.0, 3.0)]


@pytest.mark.parametrize(
    "kwargs,factor",
    [
        (dict(workers=1), 0.0),
        (dict(workers=2), 1.0),
        (dict(workers=16), 2 * 15 / 16),
        (dict(workers=16, arch="ps"), 1.0),
        (dict(workers=16, arch="ps", servers=4), 4.0),
        (dict(workers=4, arch="ps", servers=8), 1.0),
    ],
)
def test_bytes_on_the_busiest_link(kwargs, factor):
    cluster = Cluster(bandwidth_bps=8e9, **kwargs)
    assert cluster.seconds_per_byte == pytest.approx(factor * 1e-9)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(workers=0), "workers must be"),
        (dict(bandwidth_bps=0.0), "bandwidth must be > 0"),
        (dict(latency_s=-1.0), "latency must be >= 0"),
        (dict(arch="ring"), "unknown architecture 'ring'"),
        (dict(servers=2), "servers only apply"),
        (dict(arch="ps", servers=-1), "servers must be"),
    ],
)
def test_invalid_clusters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Cluster(**kwargs)
