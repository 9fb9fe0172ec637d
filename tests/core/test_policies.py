"""Behaviour specific to each policy, against hand-made event sequences and references."""

from __future__ import annotations

import random

import pytest

from gradsched.core import Scheduler, TensorSpec, policy_config
from gradsched.core.policies import ByteSchedulerConfig, FifoConfig, ProphetConfig
from gradsched.core.policies.fifo import assign_buckets


def specs(*sizes: int) -> list[TensorSpec]:
    return [TensorSpec(f"t{i}", n, layer=i, priority=i) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("seed", range(5))
def test_fifo_buckets_match_ddp(seed):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    rng = random.Random(seed)
    tensors = specs(*[rng.randint(1, 400_000) for _ in range(rng.randint(5, 60))])
    first, cap = rng.choice([(1 << 20, 25 << 20), (100_000, 1_000_000), (1, 1)])
    reverse = tensors[::-1]
    ours = assign_buckets(reverse, first, cap)
    theirs, _ = dist._compute_bucket_assignment_by_size(
        [torch.empty(t.numel) for t in reverse], [first, cap], [False] * len(reverse)
    )
    assert ours == [[reverse[i].name for i in bucket] for bucket in theirs]


@pytest.mark.parametrize("seed", range(3))
def test_ddp_buckets_counted_on_a_compressed_wire_are_ddps_buckets(seed):
    """Compressed (2 bytes per float32 element on the wire), the fallback's buckets hold the
    same tensors as DDP's, whose caps count the float32 gradient bytes."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4_000_000) for _ in range(rng.randint(5, 60))]
    wire = [TensorSpec(f"t{i}", n, layer=i, priority=i, element_size=2) for i, n in enumerate(sizes)][::-1]
    cap = rng.choice([25 << 20, 4 << 20])
    config = FifoConfig.ddp_buckets(cap, wire_ratio=0.5)
    ours = assign_buckets(wire, config.first_bucket_bytes, config.bucket_cap_bytes)
    theirs, _ = dist._compute_bucket_assignment_by_size(
        [torch.empty(t.numel) for t in wire], [dist._DEFAULT_FIRST_BUCKET_BYTES, cap], [False] * len(wire))
    assert ours == [[wire[i].name for i in bucket] for bucket in theirs]
    assert len(ours) > 2


def run(engine, events):
    """Apply ("ready", name) / ("done", k) events; k indexes launched messages. Returns
    the launched messages' names in launch order."""
    launched = []
    for t, (kind, arg) in enumerate(events):
        if kind == "ready":
            decision = engine.on_ready(arg, float(t))
        else:
            decision = engine.on_finished(launched[arg], float(t))
        launched += decision.start
    return launched


def test_fifo_launches_buckets_strictly_in_order():
    engine = Scheduler(specs(100, 100, 100), FifoConfig(bucket_cap_bytes=1, first_bucket_bytes=1).build())
    engine.begin_iteration(0.0)
    # t0's bucket is last; t1's bucket may not go before t2's
    launched = run(engine, [("ready", "t1"), ("ready", "t0"), ("ready", "t2")])
    assert [m.names for m in launched] == [["t2"], ["t1"], ["t0"]]


def test_fifo_fuses_a_bucket_into_one_message():
    engine = Scheduler(specs(10, 10, 10, 10), FifoConfig(bucket_cap_bytes=80, first_bucket_bytes=80).build())
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t3"), ("ready", "t2"), ("ready", "t1"), ("ready", "t0")])
    assert [m.names for m in launched] == [["t3", "t2"], ["t1", "t0"]]


def test_priority_lets_an_urgent_slice_overtake_queued_ones():
    engine = Scheduler(specs(400, 400), policy_config("priority", partition_bytes=400).build())
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t1"), ("ready", "t0")] + [("done", k) for k in range(5)])
    # t1 was alone, so its first slice left; then t0's slices overtake t1's queued rest
    assert [m.names[0] for m in launched] == ["t1[0]", "t0[0]", "t0[1]", "t0[2]", "t0[3]", "t1[1]"]
    assert max(len(m.names) for m in launched) == 1


def test_bytescheduler_keeps_credit_and_priority():
    config = ByteSchedulerConfig(partition_bytes=400, credit_bytes=800)
    engine = Scheduler(specs(400, 400), config.build())
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t1"), ("ready", "t0")])
    assert [m.names[0] for m in launched] == ["t1[0]", "t1[1]"]  # credit for two slices
    launched += engine.on_finished(launched[0], 2.0).start
    assert launched[-1].names == ["t0[0]"]  # the urgent tensor goes next
    assert engine.in_flight_bytes == 800


def _teach(engine, per_message, seconds_per_byte):
    """Give the engine's link estimate an exact per-message cost and throughput."""
    for size in (1000, 4000, 2000):
        engine.estimator.observe(size, per_message + size * seconds_per_byte, isolated=False)


def test_bytescheduler_holds_small_messages_off_a_busy_link():
    # per-message cost 1 ms, 1 us per byte: a message is worth its launch from 9000 bytes
    tensors = specs(25, 25, 25, 25, 5000)  # elements of 4 bytes
    engine = Scheduler(tensors, ByteSchedulerConfig(partition_bytes=20000, credit_bytes=40000).build())
    _teach(engine, 1e-3, 1e-6)
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t4"), ("ready", "t3"), ("ready", "t2"), ("ready", "t1")])
    assert [m.names for m in launched] == [["t4"]]  # the small ones wait behind the busy link
    launched += engine.on_ready("t0", 5.0).start
    assert [m.names for m in launched] == [["t4"]]
    launched += engine.on_finished(launched[0], 6.0).start  # the link has nothing else: they go, fused
    assert [m.names for m in launched] == [["t4"], ["t0", "t1", "t2", "t3"]]


def test_bytescheduler_fuses_up_to_the_amortised_size_and_sends_what_is_full():
    tensors = specs(*[750] * 6, 5000)
    engine = Scheduler(tensors, ByteSchedulerConfig(partition_bytes=20000, credit_bytes=60000).build())
    _teach(engine, 1e-3, 1e-6)  # amortised size 9000 bytes: three of these tensors
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t6")] + [("ready", f"t{i}") for i in (5, 4, 3, 2)])
    # t5..t3 fill a message worth its launch, so it goes though the link is busy; t2 waits
    assert [m.names for m in launched] == [["t6"], ["t3", "t4", "t5"]]
    assert engine.queued == 1 and engine.peek().name == "t2"


def test_bytescheduler_without_amortising_sends_every_slice_alone():
    tensors = specs(25, 25, 25, 5000)
    engine = Scheduler(tensors, ByteSchedulerConfig(partition_bytes=20000, credit_bytes=40000, amortise=0).build())
    _teach(engine, 1e-3, 1e-6)
    engine.begin_iteration(0.0)
    launched = run(engine, [("ready", "t3"), ("ready", "t2"), ("ready", "t1"), ("ready", "t0")])
    assert [m.names for m in launched] == [["t3"], ["t2"], ["t1"], ["t0"]]


def test_a_lone_small_message_goes_at_once_on_an_idle_link():
    engine = Scheduler(specs(25, 5000), ByteSchedulerConfig(partition_bytes=20000, credit_bytes=40000).build())
    _teach(engine, 1e-3, 1e-6)
    engine.begin_iteration(0.0)
    assert [m.names for m in run(engine, [("ready", "t0")])] == [["t0"]]


def test_prophet_profiles_then_plans_stages():
    config = ProphetConfig(partition_bytes=400, credit_bytes=400, profile_iterations=2)
    tensors = specs(100, 100, 100, 100)
    policy = config.build()
    engine = Scheduler(tensors, policy)
    # two bursts per iteration: t3, t2 at once; then t1, t0 ten seconds later
    for iteration in range(3):
        base = 100.0 * iteration
        engine.begin_iteration(base)
        launched = []
        for name, t in (("t3", 0.0), ("t2", 0.1), ("t1", 10.0), ("t0", 10.1)):
            launched += engine.on_ready(name, base + t).start
            while engine.in_flight_count:
                launched += engine.on_finished(engine.in_flight[0], base + t + 0.01).start
        assert engine.iteration_done
    plan = policy.flow.plan
    assert [stage.tensors for stage in plan.stages] == [("t3", "t2"), ("t1", "t0")]
    assert plan.stages[0].gap_after == pytest.approx(9.9)


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("fifo", {"bucket_cap_bytes": 0}, "bucket_cap_bytes must be >= 1, got 0"),
        ("priority", {"partition_bytes": -1}, "partition_bytes must be >= 1, got -1"),
        ("bytescheduler", {"partition_bytes": "8MiB", "credit_bytes": "4MiB"}, r"credit_bytes \(4194304\)"),
        ("prophet", {"stage_factor": 0.0}, "stage_factor must be > 0, got 0.0"),
        ("prophet", {"horizon": "soon"}, "horizon must be 'gap' or 'stage'"),
        ("prophet", {"profile_iterations": "x"}, "cannot read 'x' as int"),
        ("bytescheduler", {"credit": 1}, "has no option 'credit'"),
        ("nope", {}, "unknown policy 'nope'"),
    ],
)
def test_invalid_configs_name_the_offending_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        policy_config(name, **options)


def test_overrides_parse_sizes_and_types():
    config = policy_config("prophet", partition_bytes="512KiB", stage_factor="3", profile_iterations="4")
    assert (config.partition_bytes, config.stage_factor, config.profile_iterations) == (524288, 3.0, 4)
    assert config.as_dict()["policy"] == "prophet"
