"""Parameter-server bookkeeping that needs no processes: roles, the message-to-server
assignment, the wire layout of a message, and PS plans."""

from __future__ import annotations

import pytest
import torch

from gradsched.core import TensorSpec, policy_config
from gradsched.runtime import GradschedError
from gradsched.runtime.ps import assign, buffer_layout, message_tag, roles
from gradsched.sim.plan import default_ready_times, make_plan


def tensors(sizes):
    return [TensorSpec(f"w{i}", n, layer=i, priority=i) for i, n in enumerate(sizes)]


def test_roles_put_servers_last():
    assert roles(5, 2) == ([0, 1, 2], [3, 4])
    with pytest.raises(GradschedError, match="cannot hold 2 servers"):
        roles(2, 2)


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_assignment_balances_bytes_and_covers_every_message(servers):
    specs = tensors([100_000, 3_000, 250_000, 40_000, 7_000, 120_000])
    plan = make_plan(specs, default_ready_times(specs), policy_config("bytescheduler", partition_bytes="64KiB"),
                     arch="ps")
    owner = assign(plan, servers)
    assert len(owner) == len(plan.messages) and set(owner) == set(range(servers))
    load = [sum(m.nbytes for m, s in zip(plan.messages, owner) if s == k) for k in range(servers)]
    biggest = max(m.nbytes for m in plan.messages)
    assert max(load) - min(load) <= biggest  # greedy least-loaded: within one message
    assert assign(plan, servers) == owner  # every rank computes the same


def test_buffer_layout_groups_by_dtype_in_name_order():
    specs = tensors([10, 20, 30])
    plan = make_plan(specs, default_ready_times(specs), policy_config("fifo", bucket_cap_bytes=10_000))
    (message,) = plan.messages
    dtypes = {"w0": torch.float32, "w1": torch.float16, "w2": torch.float32}
    assert buffer_layout(message, dtypes) == [(torch.float16, 20), (torch.float32, 40)]
    assert message_tag(0, 0) != message_tag(0, 1) != message_tag(1, 0) != 0  # 0 is the header's


def test_ps_plans_cover_every_tensor_and_predict_push_then_pull():
    specs = tensors([1000, 1000])
    ready = {"w1": 0.0, "w0": 0.0}
    allreduce = make_plan(specs, ready, policy_config("fifo", bucket_cap_bytes=1 << 30), 0.0, 1e-6)
    ps = make_plan(specs, ready, policy_config("fifo", bucket_cap_bytes=1 << 30), 0.0, 1e-6, arch="ps")
    ps.check(specs)
    assert ps.span_s == pytest.approx(2 * allreduce.span_s)  # 8000 bytes pushed, then pulled
    with pytest.raises(ValueError, match="arch must be"):
        make_plan(specs, ready, policy_config("fifo"), arch="ring")
