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
    assert all(t.element_size == 2 for t in model._binder.coordinator.tensors)  # plans count wire bytes
    model.close()


def test_wire_copies_are_reused_from_round_to_round():
    from gradsched.runtime.compression import WireBuffers

    wire = WireBuffers(torch.bfloat16)
    flat, half = torch.randn(10), torch.randn(4).to(torch.bfloat16)
    first = wire.cast(1, 0, [flat, half])
    assert first[1] is half and first[0].dtype == torch.bfloat16 and torch.equal(first[0], flat.to(torch.bfloat16))
    flat.mul_(2)
    again = wire.cast(1, 0, [flat, half])
    assert again[0] is first[0] and torch.equal(again[0], flat.to(torch.bfloat16))  # same memory, new values
    assert wire.cast(2, 0, [flat])[0] is not first[0]  # a new plan version gets its own
    wire.cast(3, 0, [flat])
    assert sorted(wire._cache) == [2, 3]  # the latest two versions are kept
    assert WireBuffers(None).cast(1, 0, [flat])[0] is flat
