"""streams: one NCCL rank: gradsched's communication threads run on streams of gradsched's own,
none of which torch's pool hands to anyone else (``torch.cuda.Stream()`` gives out a few streams
per priority round robin, to the user's code and to NCCL's communicators alike): after the
model is wrapped and has trained, 64 pool streams of each priority are asked for, as a user's
code might, and none of them may be gradsched's; nor the default stream."""

from __future__ import annotations

import copy

import torch

import gradsched
from gpucheck.common import coordinator_of, mlp, one_step, row


def part_streams(device: torch.device, quick: bool) -> list[dict]:
    if device.type != "cuda":
        return [row("streams of gradsched's own", None, "no streams on CPU")]
    torch.manual_seed(0)
    model = gradsched.DistributedDataParallel(copy.deepcopy(mlp(256, 2, 8)).to(device), policy="prophet",
                                              fallback=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256, device=device)
    for _ in range(3):
        one_step(model, optimizer, x)
    launcher = coordinator_of(model).backend.exchange.launcher
    ours = [s for s in [launcher.stream, *getattr(launcher.completion, "streams", [])] if s is not None]
    handles = {s.cuda_stream for s in ours}
    pool = [torch.cuda.Stream(device, priority=p) for p in (0, -1) for _ in range(64)]
    shared = [s for s in pool if s.cuda_stream in handles]
    default = torch.cuda.default_stream(device).cuda_stream in handles
    model.close()
    ok = len(ours) == 2 and not shared and not default
    return [row("streams of gradsched's own", ok,
                f"{len(ours)} streams of gradsched's ({sorted(hex(h) for h in handles)}); of 128 pool streams "
                f"asked for after it, {len(shared)} are gradsched's; default among them: {default}",
                shared=len(shared))]
