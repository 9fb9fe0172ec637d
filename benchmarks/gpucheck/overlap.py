"""overlap: one rank, a slow link (each message delayed in proportion to its bytes on the side
that issues it).

* ``overlap``: the share of the delay hidden behind backward, gradsched against DDP with the
  same hook (DDP runs hooks on the training stream), each iteration drained;
* ``steady``: the steady state with no drain inside the loop (the device drained once, at the
  end): a policy that crosses the iteration barrier (bytescheduler) against fifo's buckets
  (which wait for every message before the next forward pass), the same delay; the policy
  must be faster, overlapping the next forward pass too."""

from __future__ import annotations

import copy
import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import judged, mlp, one_step, row, slow_link, sync, warm_up

WIDE = {"partition_bytes": 8 << 20, "credit_bytes": 32 << 20}


def _setting(device: torch.device, quick: bool) -> tuple[nn.Module, torch.Tensor, int, int]:
    cuda = device.type == "cuda"
    width, depth, batch = (4096, 8, 8192) if cuda else (256, 4, 256)
    iters = (6 if quick else 12) if cuda else 4
    torch.manual_seed(0)
    base = mlp(width, depth, width).to(device)
    x = torch.randn(batch, width, device=device)
    return base, x, iters, sum(p.numel() * p.element_size() for p in base.parameters())


def part_overlap(device: torch.device, quick: bool) -> list[dict]:
    warm_up(device)
    base, x, iters, nbytes = _setting(device, quick)
    times = {}
    for name in ("ddp", "gradsched"):
        for delayed in (False, True):  # undelayed first: the delay is made of its time
            if name == "ddp":
                model = TorchDDP(copy.deepcopy(base), bucket_cap_mb=25)
            else:
                model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy="bytescheduler",
                                                          policy_options=WIDE, fallback=False, handoff=False)
            per_byte = 0.5 * times[name, False] / nbytes if delayed else 0.0  # in all: half an iteration
            model.register_comm_hook(None, slow_link(device, per_byte))
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
            times[name, delayed] = _iteration_s(model, optimizer, x, iters, device)
            if hasattr(model, "close"):
                model.close()
            del model, optimizer
    hidden = {n: 1.0 - (times[n, True] - times[n, False]) / (0.5 * times[n, False]) for n in ("ddp", "gradsched")}
    return [row("overlap slow link hidden behind backward", judged(device, hidden["gradsched"] >= 0.5),
                f"gradsched hides {hidden['gradsched']:.0%} of a delay of half its iteration "
                f"({times['gradsched', False] * 1e3:.1f} -> {times['gradsched', True] * 1e3:.1f} ms); DDP with the "
                f"same hook {hidden['ddp']:.0%} ({times['ddp', False] * 1e3:.1f} -> {times['ddp', True] * 1e3:.1f} ms)",
                hidden=hidden["gradsched"], ddp_hidden=hidden["ddp"],
                times_s={f"{n}{'+delay' if d else ''}": t for (n, d), t in times.items()})]


def _iteration_s(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, iters: int,
                 device: torch.device) -> float:
    """Median time of one iteration, the device drained after each (warm-up iterations left out)."""
    times = []
    for i in range(iters + 2):
        sync(device)
        start = time.perf_counter()
        one_step(model, optimizer, x)
        if hasattr(model, "synchronize"):
            model.synchronize()
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def part_steady(device: torch.device, quick: bool) -> list[dict]:
    warm_up(device)
    base, x, iters, nbytes = _setting(device, quick)
    iters *= 2
    probe = gradsched.DistributedDataParallel(copy.deepcopy(base), policy="fifo", fallback=False, handoff=False)
    optimizer = torch.optim.SGD(probe.parameters(), lr=1e-4)
    compute = _iteration_s(probe, optimizer, x, 4, device)
    probe.close()
    per_byte = 0.6 * compute / nbytes  # the link: 0.6 of an iteration's compute in all
    per_iteration = {}
    for policy, options in (("fifo", {}), ("bytescheduler", WIDE)):
        model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, policy_options=options,
                                                  fallback=False, handoff=False)
        model.register_comm_hook(None, slow_link(device, per_byte))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        for _ in range(3):  # past the first rounds' set-up
            one_step(model, optimizer, x)
        model.synchronize()
        sync(device)
        start = time.perf_counter()
        for _ in range(iters):  # nothing drains the device in here
            one_step(model, optimizer, x)
        model.synchronize()
        sync(device)
        per_iteration[policy] = (time.perf_counter() - start) / iters
        model.close()
    ratio = per_iteration["bytescheduler"] / per_iteration["fifo"]
    return [row("steady no drain: a barrier-crossing policy against fifo", judged(device, ratio <= 0.97),
                f"bytescheduler {per_iteration['bytescheduler'] * 1e3:.1f} ms per iteration, fifo "
                f"{per_iteration['fifo'] * 1e3:.1f} ms ({ratio:.2f}x), the link 0.6x the compute "
                f"({compute * 1e3:.1f} ms), {iters} iterations without a drain",
                ratio=ratio, **{f"{p}_s": t for p, t in per_iteration.items()}, compute_s=compute)]
