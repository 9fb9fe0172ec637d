"""sync_bn: 2 ranks (CUDA only): a SyncBatchNorm model (the user's collectives on the default
group while gradsched's run on its own) against DDP."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import TOLERANCE, Net, batches, max_diff, row, state, train


def part_sync_bn(device: torch.device, quick: bool) -> list[dict]:
    if device.type != "cuda":
        return [row("sync_bn against DDP", None, "SyncBatchNorm needs CUDA tensors")]
    data = batches(device, 8)
    torch.manual_seed(0)
    initial = nn.SyncBatchNorm.convert_sync_batchnorm(Net()).to(device)
    reference = TorchDDP(copy.deepcopy(initial))
    train(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9), data)
    expected = state(reference)
    rows = []
    for policy in ("fifo", "prophet"):
        model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy, fallback=False)
        train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data)
        diff = max_diff(state(model), expected)
        rows.append(row(f"sync_bn {policy} against DDP", diff <= TOLERANCE, f"max |diff| {diff:.2e}",
                        max_abs_diff=diff))
        model.close()
    return rows
