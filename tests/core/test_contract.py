"""The contract every policy honours, driven by random event sequences (pure core, no simulator).

Each policy is run with small sizes so tensors really get partitioned, fused and queued.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from helpers import random_tensors
from gradsched.core import POLICIES, Scheduler, policy_config
from gradsched.core.policies.fifo import InOrderBuckets

SMALL = {
    "fifo": dict(bucket_cap_bytes=6000, first_bucket_bytes=1500),
    "priority": dict(partition_bytes=2048),
    "bytescheduler": dict(partition_bytes=2048, credit_bytes=6000),
    "bytescheduler-fused": dict(partition_bytes=1024, credit_bytes=8192, fuse_bytes=3000),
    "prophet": dict(partition_bytes=1024, credit_bytes=4096, fuse_bytes=3000, profile_iterations=2),
    "prophet-gap": dict(partition_bytes=1024, credit_bytes=4096, horizon="gap"),
}
VARIANTS = sorted(SMALL)


def build(variant: str):
    return policy_config(variant.split("-")[0], **SMALL[variant]).build()


def drive(variant: str, seed: int, iterations: int = 5, push_pull: bool = False, hold_bytes: int | None = None):
    """Feed one engine random but legal events: gradients become ready in roughly reverse
    order, in-flight messages complete in launch order, both at random times. With
    ``push_pull``, messages are also reported sent (in launch order) before they complete,
    as parameter servers' pushes are."""
    rng = random.Random(seed)
    tensors = random_tensors(rng)
    policy = build(variant)
    engine = Scheduler(tensors, policy, hold_bytes)
    max_messages = getattr(policy.flow, "max_messages", None)
    trace = []
    now = 0.0
    for iteration in range(iterations):
        engine.begin_iteration(now)
        order = sorted(tensors, key=lambda t: -t.priority + rng.uniform(-2.5, 2.5))
        ready = deque(t.name for t in order)
        in_flight: deque = deque()  # launched, not finished
        unsent: deque = deque()  # launched, not reported sent nor finished
        launched, finished = [], []
        while ready or in_flight:
            now += rng.expovariate(1.0)
            draw = rng.random()
            if ready and (not in_flight or draw < 0.4):
                name = ready.popleft()
                decision = engine.on_ready(name, now)
                trace.append(("ready", name))
            elif push_pull and unsent and draw < 0.7:
                message = unsent.popleft()
                decision = engine.on_sent(message, now)
                trace.append(("sent", message.id))
            else:
                message = in_flight.popleft()
                if message in unsent:
                    unsent.remove(message)
                decision = engine.on_finished(message, now)
                trace.append(("done", message.id))
                finished += decision.done
            for message in decision.start:
                assert message.iteration == iteration
                assert message.tasks, "empty message"
                launched += [task.id for task in message.tasks]
                trace.append(("start", message.id, tuple(message.names), message.nbytes))
            in_flight.extend(decision.start)
            unsent.extend(decision.start)
            # the window, from this test's own log: what the policy limits (in flight, or
            # still being sent) fits its window, except one lone message
            counted = list(unsent) if policy.flow.until_sent else list(in_flight)
            if len(counted) > 1:
                assert sum(m.nbytes for m in counted) <= policy.flow.window()
            if max_messages is not None:
                assert len(counted) <= max_messages
            assert engine.in_flight_bytes == sum(m.nbytes for m in in_flight)
            if hold_bytes is not None:
                check_hold(engine, policy, decision.start, hold_bytes)
        all_leaves = sorted(leaf.id for leaves in engine.leaves.values() for leaf in leaves)
        assert sorted(launched) == all_leaves, "a leaf was lost or launched twice"
        assert sorted(finished) == sorted(t.name for t in tensors), "a tensor was lost or finished twice"
        assert engine.iteration_done and engine.queued == 0
    return engine, trace


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("push_pull", [False, True])
def test_no_task_lost_or_duplicated_and_credit_respected(variant, seed, push_pull):
    drive(variant, seed, push_pull=push_pull)


def test_priority_limits_only_what_is_being_sent():
    """P3: with pushes reported sent, the next slice starts when the previous push is done,
    while its pull is still to come; without, only when it finished."""
    _, pipelined = drive("priority", 5, iterations=2, push_pull=True)
    overlaps = 0
    open_messages: set = set()
    for event in pipelined:
        if event[0] == "start":
            overlaps += bool(open_messages)
            open_messages.add(event[1])
        elif event[0] == "done":
            open_messages.discard(event[1])
    assert overlaps > 0
    _, serial = drive("priority", 5, iterations=2)
    open_messages = set()
    for event in serial:
        if event[0] == "start":
            assert not open_messages
            open_messages.add(event[1])
        elif event[0] == "done":
            open_messages.discard(event[1])


def check_hold(engine, policy, started, hold_bytes: int) -> None:
    """The memory rule after one event: no message carries slices of more than ``hold_bytes`` of
    whole gradients unless it carries one gradient only; and what waits (each gradient held whole
    until its every leaf started) is within ``hold_bytes`` unless the window admits nothing more
    (fifo bounds it by its buckets instead: each no larger than ``hold_bytes`` and its last tensor)."""
    for message in started:
        names = {task.tensor.name for task in message.tasks}
        assert len(names) == 1 or sum(engine.tensors[n].nbytes for n in names) <= hold_bytes
    if isinstance(policy.flow, InOrderBuckets):
        largest = max(t.nbytes for t in engine.tensors.values())
        assert all(sum(engine.tensors[n].nbytes for n in b) < hold_bytes + largest for b in policy.flow.buckets)
        return
    head = engine.peek()
    limited = policy.flow.limited_bytes(engine)
    slots = policy.flow.max_messages
    full = head is not None and ((limited > 0 and limited + head.nbytes > policy.flow.window())
                                 or (slots is not None and policy.flow.limited_count(engine) >= slots))
    assert engine.held_bytes() <= hold_bytes or full


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(4))
def test_memory_rule_bounds_what_waits_and_what_one_message_holds(variant, seed):
    """Under a ``hold_bytes`` (sharding's gradient budget) every policy still sends every leaf once
    within its window, and the rule holds after every event (check_hold)."""
    drive(variant, seed, hold_bytes=12000)


def test_memory_rule_starts_what_a_policy_would_hold_back():
    """Prophet's block waits for a stage; past the budget the waiting leaves start anyway."""
    _, free = drive("prophet", 2, iterations=3)
    _, bound = drive("prophet", 2, iterations=3, hold_bytes=4000)
    assert [e for e in free if e[0] == "start"] != [e for e in bound if e[0] == "start"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_under_a_seed(variant):
    assert drive(variant, 7)[1] == drive(variant, 7)[1]
    assert drive(variant, 7)[1] != drive(variant, 8)[1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_partitions_reassemble_to_the_original_sizes(variant):
    engine, _ = drive(variant, 3, iterations=1)
    limit = SMALL[variant].get("partition_bytes")
    for name, leaves in engine.leaves.items():
        spec = engine.tensors[name]
        assert [leaf.offset for leaf in leaves] == [sum(x.numel for x in leaves[:i]) for i in range(len(leaves))]
        assert sum(leaf.numel for leaf in leaves) == spec.numel
        if limit:
            assert all(leaf.nbytes <= limit for leaf in leaves)
        else:
            assert len(leaves) == 1


@pytest.mark.parametrize("variant", ["bytescheduler-fused", "prophet"])
def test_fused_messages_respect_the_fusion_size(variant):
    _, trace = drive(variant, 11)
    fuse = SMALL[variant]["fuse_bytes"]
    starts = [event for event in trace if event[0] == "start"]
    fused = [event for event in starts if len(event[2]) > 1]
    assert fused, "nothing was fused"
    assert all(nbytes <= fuse for _, _, _, nbytes in fused)


def test_every_policy_is_covered():
    assert {v.split("-")[0] for v in VARIANTS} == set(POLICIES)


def test_engine_rejects_impossible_event_sequences():
    from gradsched.core import SchedulerError, TensorSpec

    tensors = [TensorSpec("a", 10, 0, 0), TensorSpec("b", 10, 1, 1)]
    engine = Scheduler(tensors, policy_config("priority").build())
    with pytest.raises(SchedulerError, match="before begin_iteration"):
        engine.on_ready("a", 0.0)
    engine.begin_iteration(0.0)
    first = engine.on_ready("a", 0.0).start[0]
    with pytest.raises(SchedulerError, match="twice"):
        engine.on_ready("a", 0.0)
    with pytest.raises(SchedulerError, match="unknown tensor"):
        engine.on_ready("zzz", 0.0)
    with pytest.raises(SchedulerError, match="unfinished"):
        engine.begin_iteration(1.0)
    engine.on_finished(first, 1.0)
    with pytest.raises(SchedulerError, match="not in flight"):
        engine.on_finished(first, 1.0)
    with pytest.raises(ValueError, match="duplicate"):
        Scheduler(tensors + tensors[:1], policy_config("fifo").build())
