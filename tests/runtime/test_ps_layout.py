"""Parameter-server bookkeeping that needs no processes: roles, how buffers are cut over
servers, the wire layout of a message, and PS plans."""

from __future__ import annotations

import pytest
import torch

from gradsched.core import TensorSpec, policy_config
from gradsched.runtime import GradschedError
from gradsched.runtime.comm.ps import buffer_layout, chunks, message_tag
from gradsched.runtime.topology import roles
from gradsched.sim import default_ready_times, make_plan


def tensors(sizes):
    return [TensorSpec(f"w{i}", n, layer=i, priority=i) for i, n in enumerate(sizes)]


def test_roles_put_servers_last():
    assert roles(5, 2) == ([0, 1, 2], [3, 4])
    assert roles(3, 0) == ([0, 1, 2], [])  # all-reduce: every rank a worker
    with pytest.raises(GradschedError, match="cannot hold 2 servers"):
        roles(2, 2)


@pytest.mark.parametrize("numel,servers", [(10, 3), (1_000_003, 2), (5, 8), (7, 1)])
def test_chunks_cover_a_buffer_evenly_and_in_order(numel, servers):
    parts = chunks(numel, servers)
    assert len(parts) == servers and parts[0][0] == 0 and parts[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, in server order
    sizes = [hi - lo for lo, hi in parts]
    assert max(sizes) - min(sizes) <= 1  # every server carries the same bytes, within one element


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


def test_parameter_servers_on_nccl_are_refused_with_the_reason(world_of_one, monkeypatch):
    """NCCL matches point-to-point operations by order and a server receives from every worker
    first: a job on NCCL is told to use gloo for parameter servers (the group is gloo here, only
    named NCCL: no GPU is needed to see the refusal)."""
    import torch.distributed as dist
    from torch import nn

    import gradsched

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    model = nn.Linear(4, 4)
    with pytest.raises(GradschedError, match="architecture='ps' needs the gloo backend: NCCL matches"):
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), architecture="ps", servers=1)
