"""The fully sharded gather queue (gradsched.core.gathers): order from the queue alone, the
budget bounding prefetch only, needs forcing what is queued before them, and which units the
forward pass keeps whole for the backward pass."""

from __future__ import annotations

import pytest

from gradsched.core.gathers import GatherQueue, UnitState


def drain(q: GatherQueue) -> list[int]:
    issued = []
    while q.issuable():
        issued.append(q.issue())
    return issued


def test_prefetch_stays_within_the_budget_and_frees_make_room():
    q = GatherQueue([3, 3, 3, 3], budget=7)
    assert q.want([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert drain(q) == [0, 1]  # a third would hold 9 > 7 bytes
    q.landed(0)
    q.landed(1)
    q.free(0)
    assert drain(q) == [2] and q.materialized == 6


def test_a_need_issues_it_and_everything_queued_before_it_whatever_the_budget():
    q = GatherQueue([5, 5, 5], budget=5)
    q.want([0, 1, 2])
    assert drain(q) == [0]
    assert q.need(2) is True  # queued behind 1: both go now, in the queue's order
    assert drain(q) == [1, 2] and q.materialized == 15
    q.landed(1)
    assert q.need(1) is False  # whole already


def test_only_freed_units_are_queued_and_a_needed_freed_one_is_queued_last():
    q = GatherQueue([1, 1, 1], budget=10)
    q.want([0])
    assert q.want([0, 1]) == [1]  # 0 is queued already
    assert drain(q) == [0, 1]
    q.landed(0)
    assert q.free(0) and not q.free(0) and not q.free(2)  # only a whole unit is freed
    assert q.need(0) is True and q.state[0] is UnitState.QUEUED
    assert drain(q) == [0]
    assert q.settled() is False  # 0 and 1 in flight
    q.landed(0)
    q.landed(1)
    assert q.settled() and q.whole() == [0, 1]


def test_force_all_issues_everything_queued():
    q = GatherQueue([4, 4, 4], budget=4)
    q.want([2, 1, 0])
    q.force_all()
    assert drain(q) == [2, 1, 0]


@pytest.mark.parametrize("budget, kept", [(8, {3}), (12, {3, 2}), (100, {0, 1, 2, 3}), (4, set())])
def test_the_forward_pass_keeps_its_last_units_beside_one_being_gathered(budget, kept):
    q = GatherQueue([4, 4, 4, 4], budget=budget)
    assert q.keep_after_forward([0, 1, 2, 3]) == kept


def test_a_budget_must_be_positive():
    with pytest.raises(ValueError, match="budget must be > 0"):
        GatherQueue([1], budget=0)
