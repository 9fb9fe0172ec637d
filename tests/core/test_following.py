"""The rule that follows a plan (gradsched.core.following), with exact event sequences: hand
plans for each kind of release, and plans made by make_plan replayed through the follower on
the events their own simulation had, which must launch every message at its planned time."""

from __future__ import annotations

import heapq

import pytest

from gradsched.core import TensorSpec, policy_config
from gradsched.core.following import RoundFollower
from gradsched.core.plan import Plan, PlannedMessage
from gradsched.sim import make_plan

INDEX = {"w0": 0, "w1": 1, "w2": 2}


def _message(slices, after_tensor=None, after_message=None, after_sent=False):
    return PlannedMessage(tuple(slices), 4 * sum(n for _, _, n in slices), after_tensor, after_message, 0.0, 0.0,
                          after_sent)


def _drive(follower, events):
    """Apply ``events`` in order, launching whatever becomes launchable after each; the trace of
    what happened, one string per event or launch."""
    ready: set[int] = set()
    trace = []
    for kind, what in events:
        if kind == "ready":
            ready.add(INDEX[what])
        elif kind == "sent":
            follower.mark_sent(what)
        elif kind == "resolved":
            trace.append(f"reduced {sorted(follower.resolve(what))}")
        else:
            trace.append(f"reduced {sorted(follower.finish(what))}")
        trace.append(f"{kind} {what}")
        while follower.launchable(ready.__contains__):
            k, idle = follower.launch()
            trace.append(f"launch {k}{' idle' if idle else ''}")
    return trace


def test_a_resolved_message_reduces_its_gradients_but_frees_its_credit_only_once_finished():
    """CUDA: a message's results are in place (resolved, behind an event) before the device has
    run it (finished); its gradients count as reduced at the first, its credit is free at the second."""
    plan = Plan("bytescheduler", True, (
        _message([("w1", 0, 10)], after_tensor="w1"),
        _message([("w0", 0, 10)], after_message=0),
    ), span_s=1.0)
    follower = RoundFollower(plan, INDEX)
    trace = _drive(follower, [("ready", "w1"), ("ready", "w0"), ("resolved", 0), ("done", 0), ("resolved", 1),
                              ("done", 1)])
    assert trace == ["ready w1", "launch 0 idle", "ready w0",
                     "reduced [1]", "resolved 0",  # w1 reduced; message 1 still waits for message 0's end
                     "reduced []", "done 0", "launch 1 idle",
                     "reduced [0]", "resolved 1", "reduced []", "done 1"]
    assert follower.complete
    with pytest.raises(ValueError, match="resolved twice"):
        follower.resolve(1)


def test_a_credit_window_releases_a_message_when_an_earlier_one_finishes():
    plan = Plan("bytescheduler", True, (
        _message([("w2", 0, 10)], after_tensor="w2"),
        _message([("w1", 0, 10)], after_tensor="w1"),
        _message([("w0", 0, 5)], after_message=0),
        _message([("w0", 5, 5)], after_message=1),
    ), span_s=1.0)
    follower = RoundFollower(plan, INDEX)
    trace = _drive(follower, [("ready", "w2"), ("ready", "w1"), ("ready", "w0"), ("done", 1), ("done", 0),
                              ("done", 2), ("done", 3)])
    assert trace == [
        "ready w2", "launch 0 idle",
        "ready w1", "launch 1",
        "ready w0",  # message 2 waits for message 0, though its gradient is ready
        "reduced [1]", "done 1",  # 1 finished first: message 2 still waits for 0, and 3 for 2 (order is fixed)
        "reduced [2]", "done 0", "launch 2 idle", "launch 3",
        "reduced []", "done 2",  # w0 has a slice left
        "reduced [0]", "done 3",
    ]
    assert follower.complete


def test_a_message_waits_for_its_own_gradients_and_its_releasing_one():
    plan = Plan("prophet", True, (
        _message([("w2", 0, 10), ("w1", 0, 10)], after_tensor="w1"),
        _message([("w0", 0, 10)], after_tensor="w0", after_message=0),
    ), span_s=1.0)
    follower = RoundFollower(plan, INDEX)
    assert _drive(follower, [("ready", "w2"), ("ready", "w0"), ("ready", "w1"), ("done", 0), ("done", 1)]) == [
        "ready w2", "ready w0", "ready w1", "launch 0 idle", "reduced [1, 2]", "done 0", "launch 1 idle",
        "reduced [0]", "done 1"]


def test_a_window_over_pushes_releases_on_sent():
    plan = Plan("bytescheduler", True, (
        _message([("w2", 0, 10)], after_tensor="w2"),
        _message([("w1", 0, 10)], after_message=0, after_sent=True),
    ), span_s=1.0)
    follower = RoundFollower(plan, {"w1": 1, "w2": 2})
    assert _drive(follower, [("ready", "w2"), ("ready", "w1"), ("sent", 0), ("done", 0), ("done", 1)]) == [
        "ready w2", "launch 0 idle", "ready w1", "sent 0", "launch 1", "reduced [2]", "done 0", "reduced [1]",
        "done 1"]


def test_what_the_next_message_lacks_and_who_carries_a_gradient():
    plan = Plan("fifo", False, (
        _message([("w1", 0, 10)], after_tensor="w2"),
        _message([("w0", 0, 10)]),
    ), span_s=1.0)
    follower = RoundFollower(plan, INDEX)
    assert follower.lacking(lambda i: False) == [1, 2]
    assert follower.lacking({1}.__contains__) == [2]
    assert follower.carries_from(0, 0) and follower.carries_from(0, 1) and not follower.carries_from(1, 1)


def test_misuse_is_refused():
    follower = RoundFollower(Plan("fifo", False, (_message([("w0", 0, 10)]),), span_s=1.0), INDEX)
    with pytest.raises(ValueError, match="not started"):
        follower.finish(0)
    follower.launch()
    with pytest.raises(ValueError, match="every message"):
        follower.launch()
    follower.finish(0)
    with pytest.raises(ValueError, match="twice"):
        follower.finish(0)


def _replay(plan: Plan, ready_s: dict[str, float], index: dict[str, int]) -> list[float]:
    """Feed the follower the events of the plan's own simulated round (gradients ready at
    their times, each message finishing at its planned finish, once launched) and return
    when it launched each message."""
    follower = RoundFollower(plan, index)
    first = min(ready_s.values())
    events = [(t - first, 0, "ready", index[name]) for name, t in ready_s.items()]
    heapq.heapify(events)
    ready: set[int] = set()
    launched: list[float] = []
    while events:
        now = events[0][0]
        while events and events[0][0] == now:  # everything that happens at this instant, then launches
            _, _, kind, what = heapq.heappop(events)
            if kind == "ready":
                ready.add(what)
            else:
                follower.finish(what)
        while follower.launchable(ready.__contains__):
            k, _ = follower.launch()
            launched.append(now)
            heapq.heappush(events, (plan.messages[k].finish_s, 1, "done", k))
    assert follower.complete
    return launched


@pytest.mark.parametrize("policy,options", [
    ("fifo", {"bucket_cap_bytes": 8000, "first_bucket_bytes": 2000}), ("priority", {}), ("bytescheduler", {"partition_bytes": 3000, "credit_bytes": 7000}),
    ("prophet", {}),
])
def test_plans_made_by_the_simulator_launch_at_their_planned_times(policy, options):
    tensors = [TensorSpec(f"w{i}", 500 + 300 * (i % 4), layer=i, priority=i) for i in range(12)]
    ready = {f"w{i}": (11 - i) * 2e-4 + (1e-4 if i % 3 == 0 else 0.0) for i in range(12)}
    plan = make_plan(tensors, ready, policy_config(policy, **options), seconds_per_byte=1e-7)
    index = {t.name: i for i, t in enumerate(tensors)}
    launched = _replay(plan, ready, index)
    assert launched == pytest.approx([m.launch_s for m in plan.messages], abs=1e-12)
    assert len(plan.messages) >= 5
    if policy in ("priority", "bytescheduler"):  # windows: most messages are released by an earlier one's end
        assert sum(m.after_message is not None for m in plan.messages) > len(plan.messages) // 2


def test_following_a_round_asks_about_each_gradient_about_once_however_often_it_is_asked():
    """Readiness only grows within a round, so the search for the next message's first missing
    gradient goes on from where it stopped: the launcher asks at every gradient handed over,
    and a message of many gradients must not make that quadratic."""
    names = [f"g{i}" for i in range(50)]
    index = {name: i for i, name in enumerate(names)}
    plan = Plan("prophet", True, (_message([(name, 0, 1) for name in names], after_tensor="g0"),), span_s=1.0)
    follower = RoundFollower(plan, index)
    ready: set[int] = set()
    asked = []

    def is_ready(i: int) -> bool:
        asked.append(i)
        return i in ready

    for i in range(50):
        assert not follower.launchable(is_ready)
        ready.add(i)
    assert follower.launchable(is_ready) and follower.lacking(is_ready) == []
    assert len(asked) <= 2 * 50 + 2  # each need once when ready, once more while it was the first missing


def test_a_follower_of_the_next_round_of_the_same_plan_starts_afresh_and_shares_the_plans_structure():
    plan = Plan("priority", True, (
        _message([("w1", 0, 10)], after_tensor="w1"),
        _message([("w0", 0, 5), ("w2", 0, 10)], after_message=0),
        _message([("w0", 5, 5)], after_message=1)), span_s=1.0)
    first = RoundFollower(plan, INDEX)
    trace = _drive(first, [("ready", "w1"), ("ready", "w2"), ("ready", "w0"), ("finished", 0), ("finished", 1)])
    again = first.again()
    assert again.launched == 0 and again.in_flight == 0 and not any(again.done) and again.remaining == {0: 2, 1: 1, 2: 1}
    assert again.messages_of is first.messages_of and again.carried(1) == (0, 2)
    assert first.launched == 3 and first.remaining[0] == 1  # the first round's progress is its own
    assert _drive(again, [("ready", "w1"), ("ready", "w2"), ("ready", "w0"), ("finished", 0), ("finished", 1)]) == trace
