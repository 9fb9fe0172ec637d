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
        (dict(cast_s_per_byte=-1e-9), "cast cost must be >= 0"),
        (dict(arch="ring"), "unknown architecture 'ring'"),
        (dict(servers=2), "servers only apply"),
        (dict(arch="ps", servers=-1), "servers must be"),
    ],
)
def test_invalid_clusters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Cluster(**kwargs)


def test_compression_casts_before_sending_one_at_a_time_and_back_after_arriving():
    """Hand-computed: 1 MB/s, 0.5 s latency, casts of 0.25 s per MB each way."""
    cluster = Cluster(workers=2, bandwidth_bps=8e6, latency_s=0.5, cast_s_per_byte=0.25e-6)
    net = make_network(cluster)
    a = net.submit(10**6, 0.0)  # cast 0-0.25, wire 0.25-1.25, arrives 1.75, cast back 1.75-2.0
    b = net.submit(10**6, 0.1)  # cast 0.25-0.5 (the caster was busy), wire 1.25-2.25 (queued), back 2.75-3.0
    c = net.submit(2 * 10**6, 5.0)  # all idle: cast 5-5.5, wire 5.5-7.5, arrives 8.0, back 8.0-8.5
    assert [[(s.lane, s.start, s.end) for s in t.segments] for t in (a, b, c)] == [
        [("link", 0.25, 1.25), ("cast", 0.0, 0.25), ("cast back", 1.75, 2.0)],
        [("link", 1.25, 2.25), ("cast", 0.25, 0.5), ("cast back", 2.75, 3.0)],
        [("link", 5.5, 7.5), ("cast", 5.0, 5.5), ("cast back", 8.0, 8.5)],
    ]
    assert [a.complete, b.complete, c.complete] == [2.0, 3.0, 8.5]


def test_compression_casts_around_push_and_pull():
    cluster = Cluster(workers=2, bandwidth_bps=8e6, latency_s=0.0, arch="ps", servers=2, cast_s_per_byte=0.5e-6)
    t = make_network(cluster).submit(10**6, 0.0)
    assert [(s.lane, s.start, s.end) for s in t.segments] == [
        ("push", 0.5, 1.5), ("pull", 1.5, 2.5), ("cast", 0.0, 0.5), ("cast back", 2.5, 3.0)]
    assert t.complete == 3.0


def test_casts_are_not_counted_as_link_time():
    from gradsched.models.table import Layer, ModelTable, ParamSpec
    from gradsched.sim import simulate

    table = ModelTable("one", (Layer("a", 1.0, 1.0, (ParamSpec("w", 10**6, element_size=2),)),))
    plain, cast = (simulate(table, Cluster(2, 8e6, 0.0, cast_s_per_byte=c), "fifo", iterations=6)
                   for c in (0.0, 0.25e-6))
    # 2 s of wire time after 1 s of backward; the casts (0.5 s each way) lengthen the iteration, not the wire's busy time
    assert cast.iteration_s == pytest.approx(plain.iteration_s + 1.0)
    busy = plain.link_utilisation * plain.iteration_s
    assert cast.link_utilisation * cast.iteration_s == pytest.approx(busy)


def test_fully_sharded_has_the_links_of_sharded_and_its_budgets_only_where_they_apply():
    from gradsched.models.table import Layer, ModelTable, ParamSpec
    from gradsched.sim import simulate

    full, sharded = Cluster(workers=4, arch="fully_sharded"), Cluster(workers=4, arch="sharded")
    assert full.phase_seconds_per_byte == sharded.phase_seconds_per_byte == sharded.seconds_per_byte / 2
    one = ModelTable("one", (Layer("l", 0.1, 0.2, (ParamSpec("w", 1000),)),))
    with pytest.raises(ValueError, match="gather budget applies to Cluster.arch='fully_sharded'"):
        simulate(one, sharded, "fifo", gather_budget_bytes=4000)
    with pytest.raises(ValueError, match="gradient budget applies to the sharded architectures"):
        simulate(one, Cluster(workers=4), "fifo", hold_bytes=4000)
