"""gradsched.runtime.comm.layout.Layouts: a plan's flat buffers live while a round may follow it."""

from __future__ import annotations

import torch

from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.layout import Layouts
from gradsched.runtime.comm.plans import PlanVersions


def plan(*messages: tuple[tuple[str, int, int], ...]) -> Plan:
    return Plan("fifo", False, tuple(PlannedMessage(m, 0, None, None, 0.0, 0.0) for m in messages), 0.0)


def test_the_layout_of_a_plan_no_round_follows_is_dropped_at_the_next_request():
    params = [torch.zeros(4), torch.zeros(2)]
    index = {"a": 0, "b": 1}
    versions = PlanVersions(plan((("a", 0, 4), ("b", 0, 2))))
    layouts = Layouts(index, params, versions)
    first = layouts.of(versions.for_round(1))
    assert list(first.fused) == [0]  # one message over both gradients: reduced in place
    versions.adopt(plan((("b", 0, 2),), (("a", 0, 4),)), first_round=3)
    second = layouts.of(versions.for_round(3))  # made while round 2 may still follow the first
    assert layouts.of(versions.for_round(2)) is first and layouts.of(versions.for_round(3)) is second
    versions.forget_before(3)  # the launcher is at round 3: nothing follows the first plan
    assert layouts.of(versions.for_round(3)) is second
    assert list(layouts._made) == [2]  # the first plan's buffer (as large as the gradients) let go
