"""profile: one rank, a layer that sleeps a known time in forward and in backward (on the
device's stream): found with those times in the exported profile (device times, not host ones)."""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

import gradsched
from gpucheck.common import device_sleep, judged, row, warm_up
from gradsched.models.table import ModelTable


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, device, forward_s, backward_s):  # noqa: ANN001 - autograd's signature
        ctx.device, ctx.backward_s = device, backward_s
        device_sleep(device, forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        device_sleep(ctx.device, ctx.backward_s)
        return grad.clone(), None, None, None


class Sleeper(nn.Module):
    """A layer that sleeps ``forward_s`` in forward and ``backward_s`` in backward (on the device's stream)."""

    def __init__(self, device: torch.device, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, device=device))
        self.device, self.forward_s, self.backward_s = device, forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x * self.scale, self.device, self.forward_s, self.backward_s)


def part_profile(device: torch.device, quick: bool) -> list[dict]:
    warm_up(device)
    forward_s, backward_s = 0.020, 0.040
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), Sleeper(device, forward_s, backward_s), nn.Linear(64, 8)).to(device)
    ours = gradsched.DistributedDataParallel(model, policy="prophet", profile_rounds=3, fallback=False)
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.01)
    x = torch.randn(32, 64, device=device)
    for _ in range(8):  # no drain of the device inside the loop: host clocks would see nothing
        ours(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as tmp:
        table = ModelTable.load(ours.export_profile(os.path.join(tmp, "p.json")))
    ours.close()
    layer = next((layer for layer in table.layers if layer.name.startswith("1")), None)
    if layer is None:
        return [row("profile a sleeping layer", False, f"no layer '1' in the profile: {[l.name for l in table.layers]}")]
    ratios = (layer.forward_s / forward_s, layer.backward_s / backward_s)
    ok = all(0.7 <= r <= 1.6 for r in ratios)
    return [row("profile a sleeping layer", judged(device, ok),
                f"forward {layer.forward_s * 1e3:.1f} ms (slept {forward_s * 1e3:.0f}), backward "
                f"{layer.backward_s * 1e3:.1f} ms (slept {backward_s * 1e3:.0f}): ratios {ratios[0]:.2f} / {ratios[1]:.2f}",
                forward_ratio=ratios[0], backward_ratio=ratios[1])]
