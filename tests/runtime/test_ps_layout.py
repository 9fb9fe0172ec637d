"""Parameter-server bookkeeping that needs no processes: roles, how buffers are cut over
servers, the wire layout of a message, and PS plans."""

from __future__ import annotations

import pytest
import torch

from gradsched.core import TensorSpec, policy_config
from gradsched.runtime import GradschedError
from gradsched.runtime.architectures.servers.pushpull import MAX_PIECES, PIECE_BYTES, buffer_layout, chunks, message_tag, pieces
from gradsched.runtime.comm.topology import roles
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


@pytest.mark.parametrize("lo,hi,size", [(0, 10, 4), (5, 5 + (PIECE_BYTES // 4) * 3 + 7, 4), (100, 100 + (1 << 28), 2),
                                         (3, 4, 8)])
def test_pieces_cover_a_chunk_in_order_within_the_limits(lo, hi, size):
    parts = pieces(lo, hi, size)
    assert parts[0][0] == lo and parts[-1][1] == hi and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert len(parts) <= MAX_PIECES
    lengths = [b - a for a, b in parts]
    assert max(lengths) * size <= max(PIECE_BYTES, -(-(hi - lo) // MAX_PIECES) * size)
    assert all(n == lengths[0] for n in lengths[:-1])  # equal pieces but the last
    assert pieces(7, 7, 4) == []


def test_tags_of_pieces_never_collide():
    tags = [message_tag(k, j, p) for k in range(40) for j in range(16) for p in range(MAX_PIECES)]
    assert len(set(tags)) == len(tags) and 0 not in tags and max(tags) < 2 ** 31


def test_buffer_layout_groups_by_dtype_in_name_order():
    specs = tensors([10, 20, 30])
    plan = make_plan(specs, default_ready_times(specs), policy_config("fifo", bucket_cap_bytes=10_000))
    (message,) = plan.messages
    dtypes = {"w0": torch.float32, "w1": torch.float16, "w2": torch.float32}
    assert buffer_layout(message, dtypes) == [(torch.float16, 20), (torch.float32, 40)]
    # with compression each dtype's group still travels on its own, cast (as the launcher packs it):
    # one bf16 buffer of all 60 was what the servers expected, and a float64 layer among float32 ones failed
    assert buffer_layout(message, dtypes, torch.bfloat16) == [(torch.bfloat16, 20), (torch.bfloat16, 40)]
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
