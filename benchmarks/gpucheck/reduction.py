"""reduction: 2 gloo ranks with different data, every policy, fp32 and fp16 on the wire, and over
a slow link: gradients produced on a side stream behind a long sleep, read on a third stream
right after ``backward()``, against the average computed here; the communication threads'
streams and the stream the hook ran on are not the default stream."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import gradsched
from gpucheck.common import (POLICIES, SLEEP_CYCLES, SMALL, TOLERANCE, coordinator_of, mlp, on, row, side_stream,
                             slow_link, sync)


def part_reduction(device: torch.device, quick: bool) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    base = mlp(256, 3, 64).to(device)
    inputs = [torch.randn(128, 256, generator=torch.Generator().manual_seed(10 + r)).mul(1 + r).to(device)
              for r in range(world)]
    expected = [torch.zeros_like(p) for p in base.parameters()]
    for x in inputs:  # the average of every rank's gradient, computed here
        reference = copy.deepcopy(base)
        reference(x).pow(2).mean().backward()
        for e, p in zip(expected, reference.parameters()):
            e.add_(p.grad / world)
    scale = max(e.abs().nan_to_num(float("inf")).max().item() for e in expected)
    own = max((p.grad - e).abs().nan_to_num(float("inf")).max().item() for p, e in zip(reference.parameters(), expected))  # the last rank's
    rows = []
    policies = POLICIES if not quick else ("fifo", "bytescheduler", "prophet")
    cases = [(p, c, None) for c in (None, "fp16") for p in policies]
    cases += [(p, None, 2e-9 if device.type == "cuda" else 4e-8) for p in ("fifo", "prophet")]  # s per byte
    for policy, compression, slow in cases:
        model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, compression=compression,
                                                  policy_options=SMALL[policy], fallback=False, handoff=False)
        seen: list = []
        if slow is not None:
            model.register_comm_hook(None, slow_link(device, slow, seen))
        read = _read_right_after_backward(model, inputs[rank], device)
        diff = max((r - e).abs().nan_to_num(float("inf")).max().item() for r, e in zip(read, expected))
        tolerance = (1e-2 if compression else TOLERANCE) * scale
        where = "over a slow link" if slow is not None else compression or "fp32"
        rows.append(row(f"reduction {policy} {where}", diff <= tolerance,
                        f"read on a third stream right after backward: max |diff| {diff:.2e} from the average "
                        f"(tolerance {tolerance:.1e}; a rank's own gradient is {own:.2e} away)", max_abs_diff=diff))
        if slow is not None and policy == "prophet":
            rows.append(_streams_row(model, seen, device))
        model.close()
    return rows


def _read_right_after_backward(model: nn.Module, x: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    side, consumer = side_stream(device), side_stream(device)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with on(side):
        if side is not None:
            torch.cuda._sleep(SLEEP_CYCLES)  # the gradients are written long after the launch
        model(x).pow(2).mean().backward()
    if consumer is not None and side is not None:
        consumer.wait_stream(side)  # what a user's stream does to see backward's gradients
    with on(consumer):
        read = [p.grad.detach().clone() for p in model.parameters()]
    sync(device)
    return read


def _streams_row(model: Any, seen: list, device: torch.device) -> dict:
    """The launcher's and the completion's threads, and the hook calls, ran off the default stream."""
    launcher = coordinator_of(model).backend.exchange.launcher
    streams = [launcher.stream, *getattr(launcher.completion, "streams", [])]
    if device.type != "cuda":
        return row("reduction streams of the communication threads", None, "no streams on CPU")
    default = torch.cuda.default_stream(device)
    off = all(s is not None and s != default for s in streams + seen) and len(set(streams)) == len(streams)
    return row("reduction streams of the communication threads", off,
               f"launcher {launcher.stream}, completion {streams[1:]}, hook calls on "
               f"{sorted({str(s) for s in seen})}; default {default}")
