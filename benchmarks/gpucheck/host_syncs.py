"""host_syncs: one rank, torch.profiler: CUDA synchronizations per iteration on the training
thread against DDP's; gradsched's Python calls per iteration."""

from __future__ import annotations

import copy
import os
import sys
import threading

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import SMALL, judged, mlp, one_step, row, sync


SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")


def part_host_syncs(device: torch.device, quick: bool) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    base = mlp(512, 4, 10).to(device)
    x = torch.randn(64, 512, device=device)
    iters = 10
    counts, calls = {}, {}
    for name in ("ddp", "gradsched"):
        if name == "ddp":
            model = TorchDDP(copy.deepcopy(base))
        else:
            model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy="bytescheduler",
                                                      policy_options=SMALL["bytescheduler"], fallback=False,
                                                      handoff=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(5):  # past the first rounds' set-up
            one_step(model, optimizer, x)
        sync(device)
        ours = {t.native_id for t in threading.enumerate() if t.name.startswith("gradsched-")}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(iters):
                one_step(model, optimizer, x)
        sync(device)
        syncs = [e for e in prof.events() if e.name in SYNCS and e.thread not in ours]
        counts[name] = len(syncs) / iters
        calls[name] = _python_calls(model, optimizer, x) if name == "gradsched" else 0
        if hasattr(model, "close"):
            model.close()
    ok = counts["gradsched"] <= counts["ddp"]
    return [row("host_syncs on the training thread per iteration", judged(device, ok),
                f"gradsched {counts['gradsched']:.1f}, DDP {counts['ddp']:.1f} ({', '.join(SYNCS)})",
                gradsched=counts["gradsched"], ddp=counts["ddp"]),
            row("host_syncs gradsched's Python calls per iteration", None,
                f"{calls['gradsched']:.0f} calls into gradsched's modules on the training thread "
                "(DDP's reducer: C++)", calls=calls["gradsched"])]


def _python_calls(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, iters: int = 5) -> float:
    """Python function calls in gradsched's modules on this thread, per iteration."""
    count = [0]
    root = os.path.dirname(gradsched.__file__)

    def tracer(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and frame.f_code.co_filename.startswith(root):
            count[0] += 1

    sys.setprofile(tracer)
    try:
        for _ in range(iters):
            one_step(model, optimizer, x)
    finally:
        sys.setprofile(None)
    return count[0] / iters
