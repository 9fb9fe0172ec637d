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
