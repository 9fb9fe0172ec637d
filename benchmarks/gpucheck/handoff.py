"""handoff: 2 gloo ranks, the buckets kept and handed to DDP's reducer: values equal to DDP's,
gradsched's flat buffers freed (weak references), and the memory it holds after the hand-off
against DDP's, measured alike: allocated once training ended (every gradient set to None, the
device drained), less what was allocated before the model was wrapped, each run alone."""

from __future__ import annotations

import copy
import gc
import weakref

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import TOLERANCE, Net, batches, coordinator_of, max_diff, row, state, sync, train


def _allocated(device: torch.device) -> int:
    gc.collect()
    sync(device)
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def part_handoff(device: torch.device, quick: bool) -> list[dict]:
    data = batches(device, 16)
    torch.manual_seed(0)
    initial = Net(width=256).to(device)
    held = {}
    before = _allocated(device)
    reference = TorchDDP(copy.deepcopy(initial))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    train(reference, ref_opt, data)
    held["ddp"] = _allocated(device) - before
    expected = state(reference)
    del reference, ref_opt
    before = _allocated(device)
    model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy="prophet", profile_rounds=2,
                                              trial_rounds=3, trial_pairs=1, fallback_gain=0.99)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    co = coordinator_of(model)
    flat: dict[int, tuple[weakref.ref, int]] = {}  # every flat buffer gradsched made, while it trains itself

    def look(step: int) -> None:
        if co.run.handed_off_round is None:  # gradsched's own plane still reduces
            for layout in list(co.backend.exchange._layouts._made.values()):
                for home in layout.homes.values():
                    base = home._base if home._base is not None else home
                    flat.setdefault(id(base), (weakref.ref(base), base.numel() * base.element_size()))

    train(model, optimizer, data, look)
    model.synchronize()
    held["gradsched"] = _allocated(device) - before
    alive = [nbytes for ref, nbytes in flat.values() if ref() is not None]
    handed = model.stats.handed_off_round
    diff = max_diff(state(model), expected)
    model.close()
    rows = [row("handoff values against DDP", diff <= TOLERANCE and handed is not None,
                f"handed off at round {handed}; max |diff| {diff:.2e}", max_abs_diff=diff),
            row("handoff frees the flat buffers", handed is not None and not alive and bool(flat),
                f"{len(flat)} flat buffers made ({sum(n for _, n in flat.values()) / 2**20:.2f} MiB), "
                f"{len(alive)} still alive after the hand-off", alive=len(alive))]
    if device.type == "cuda":
        ratio = held["gradsched"] / max(held["ddp"], 1)
        rows.append(row("handoff memory against DDP", ratio <= 1.05,
                        f"{held['gradsched'] / 2**20:.1f} MiB held after the hand-off, DDP {held['ddp'] / 2**20:.1f} "
                        f"MiB, each from before its model was wrapped ({ratio:.2f}x)", ratio=ratio,
                        held_bytes=held["gradsched"], ddp_held_bytes=held["ddp"]))
    return rows
