"""compression=: one clear error for each bad input, at wrap time (one gloo rank)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradsched
from gradsched.runtime import GradschedError


class WithComplex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.real = nn.Linear(4, 4)
        self.phase = nn.Parameter(torch.randn(4, dtype=torch.complex64))


@pytest.mark.parametrize("compression, model, error, match", [
    ("zstd", nn.Linear(4, 4), ValueError, "unknown compression 'zstd'; choose 'bf16', 'fp16' or None"),
    ("bf16", WithComplex(), GradschedError, "parameter 'phase' is torch.complex64; only floating-point"),
])
def test_bad_compression_is_refused_at_wrap_time(world_of_one, compression, model, error, match):
    with pytest.raises(error, match=match):
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), compression=compression)


def test_the_ddp_drop_in_takes_compression_too(world_of_one):
    model = gradsched.DistributedDataParallel(nn.Linear(4, 4), compression="bf16")
    assert all(t.element_size == 2 for t in model._binder.coordinator.backend.tensors)  # plans count wire bytes
    model.close()


@pytest.mark.parametrize("compression, cap", [(None, 3 << 20), ("bf16", 3 << 19)])
def test_the_fallbacks_buckets_are_ddps_counted_in_wire_bytes(world_of_one, compression, cap):
    """DDP caps buckets in float32 gradient bytes, also with a compression hook; the plans
    count wire bytes, so compressed the fallback's caps are halved (the same tensors per bucket)."""
    model = gradsched.DistributedDataParallel(nn.Linear(4, 4), compression=compression, bucket_cap_mb=3)
    buckets = model._binder.coordinator.backend.planner.predictor.buckets()
    assert (buckets.bucket_cap_bytes, buckets.first_bucket_bytes) == (cap, cap // 3)
    model.close()


def test_wire_copies_are_reused_once_their_message_has_ended():
    from gradsched.runtime.comm.compression import WireBuffers
    from gradsched.runtime.comm.transport import MessageKey

    wire = WireBuffers(torch.bfloat16)
    flat, half = torch.randn(10), torch.randn(4).to(torch.bfloat16)
    first = wire.cast(MessageKey(1, 1, 0), [flat, half])
    assert first[1] is half and first[0].dtype == torch.bfloat16 and torch.equal(first[0], flat.to(torch.bfloat16))
    flat.mul_(2)
    # the next round's message launched before the first ended (on NCCL: its collective queued, not
    # run): the copy the collective will read must not be written again, so this one is new
    early = wire.cast(MessageKey(2, 1, 0), [flat, half])
    assert early[0] is not first[0] and torch.equal(first[0], (flat / 2).to(torch.bfloat16))
    wire.finished(MessageKey(1, 1, 0))
    wire.finished(MessageKey(2, 1, 0))
    flat.mul_(2)
    again = wire.cast(MessageKey(3, 1, 0), [flat, half])
    assert again[0] is first[0] or again[0] is early[0]  # memory of an ended message, new values
    assert torch.equal(again[0], flat.to(torch.bfloat16))
    assert wire.cast(MessageKey(4, 2, 0), [flat])[0] is not again[0]  # a new plan version gets its own
    wire.cast(MessageKey(5, 3, 0), [flat])
    assert sorted(wire._cache) == [2, 3]  # the latest two versions are kept
    wire.release()  # the hand-off: nothing kept
    assert not wire._cache and not wire._busy
    assert WireBuffers(None).cast(MessageKey(1, 1, 0), [flat])[0] is flat


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_the_probe_measures_the_wire_dtype_and_the_casts(world_of_one, monkeypatch, wire):
    """The prediction of a compressed run needs the rate of all-reducing the wire dtype and
    what casting to it and back costs (measured on a real tensor; a cast of 1 MiB cannot be free)."""
    import torch.distributed as dist
    from gradsched.runtime.planning.probe import cast_cost, probe_link

    reduced = []  # (elements, dtype) of every all-reduce the probe runs (they still run)
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: reduced.append((t.numel(), t.dtype)) or real(t, *a, **k))
    plain = probe_link(None, large_elements=1 << 18, repeats=3)
    assert {dtype for n, dtype in reduced if n > 16} == {torch.float32}
    reduced.clear()
    compressed = probe_link(None, large_elements=1 << 18, repeats=3, wire=wire)
    assert {dtype for n, dtype in reduced if n > 16} == {wire}
    assert plain.cast_s_per_byte == 0.0 and plain.seconds_per_byte > 0
    assert compressed.cast_s_per_byte > 0 and compressed.seconds_per_byte > 0
    assert 0 < cast_cost(wire, elements=1 << 19, repeats=3) < 1e-6  # well under a microsecond per byte on any CPU


def test_the_wrap_time_probe_runs_on_the_parameters_device(world_of_one, monkeypatch):
    """The probe all-reduces on the device the gradients live on, whatever the backend is called
    and whichever device is current: a script that moves its model with ``model.to(local_rank)``
    and never calls ``torch.cuda.set_device`` must not probe (and initialise NCCL) on GPU 0. Here
    the backend is named "nccl" and asking for the current CUDA device fails: the probe must
    still run, on the parameters' device (the CPU, with gloo underneath)."""
    from gradsched.runtime.comm import compression

    probed = []
    real_all_reduce = compression.dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        probed.append((tensor.device, tensor.dtype))
        return real_all_reduce(tensor, *args, **kwargs)

    def no_current_device():
        raise AssertionError("the probe asked for the current CUDA device instead of the parameters' device")

    monkeypatch.setattr(compression.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(compression.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.cuda, "current_device", no_current_device)
    model = nn.Linear(4, 4)
    _, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), compression="bf16")
    optimizer.close()
    assert (torch.device("cpu"), torch.bfloat16) in probed
