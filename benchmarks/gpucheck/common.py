"""What the GPU check's parts share: rows and verdicts, device sleeps (calibrated once the GPU
is warm), the slow-link communication hook, small models, data and comparisons."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

import gradsched

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
SMALL = {"fifo": {}, "priority": {"partition_bytes": 1 << 16},
         "bytescheduler": {"partition_bytes": 1 << 16, "credit_bytes": 1 << 18},
         "prophet": {"partition_bytes": 1 << 16, "credit_bytes": 1 << 18, "fuse_bytes": 1 << 17}}
TOLERANCE = 1e-5
SLEEP_CYCLES = 200_000_000  # about 0.1-0.2 s of a GPU's clock: a side stream's head start


class Part(NamedTuple):
    run: Callable[[torch.device, bool], list[dict]]
    world: int
    backend: str  # "gloo" (even on CUDA: two ranks on one GPU), "nccl" (on CUDA; gloo on CPU)
    timeout_s: float  # what it may take on the lent GPU (the budget skips it where less is left)
    env: dict | None = None  # environment of its ranks on CPU (the NCCL part: NCCL's semantics emulated)


def row(check: str, ok: bool | None, detail: str, **figures: Any) -> dict:
    return {"check": check, "ok": ok, "detail": detail, **figures}


def judged(device: torch.device, ok: bool) -> bool | None:
    """``ok`` on CUDA; None (shown, not judged) on CPU."""
    return ok if device.type == "cuda" else None


def on(stream: Any) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def side_stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CYCLES_PER_S: list[float] = []


def warm_up(device: torch.device, seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` (clocks up) before anything is timed or calibrated."""
    if device.type != "cuda":
        return
    a = torch.randn(2048, 2048, device=device)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize(device)


def cycles_per_second(device: torch.device) -> float:
    """What ``torch.cuda._sleep`` sleeps per cycle here, measured with events on a warm GPU."""
    if not _CYCLES_PER_S:
        warm_up(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_S.append(50_000_000 / (start.elapsed_time(end) / 1e3))
    return _CYCLES_PER_S[0]


def device_sleep(device: torch.device, seconds: float) -> None:
    """Occupy the current stream (CUDA) or this thread (CPU) for ``seconds``."""
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * cycles_per_second(device)))
    else:
        time.sleep(seconds)


def slow_link(device: torch.device, seconds_per_byte: float, seen: list | None = None):
    """A DDP communication hook: all-reduce (divided first, as DDP's default hook), each message
    delayed by its bytes times ``seconds_per_byte`` on the side that issues it: on CUDA a sleep
    queued on the issuing stream before the collective, on CPU a sleep before the result is
    handed back. ``seen`` collects the stream each call ran on."""

    def hook(state, bucket):  # unannotated: DDP checks annotations against its own classes
        group = state if isinstance(state, dist.ProcessGroup) else None
        buffer = bucket.buffer()
        delay = buffer.numel() * buffer.element_size() * seconds_per_byte
        if seen is not None:
            seen.append(torch.cuda.current_stream(device) if device.type == "cuda" else None)
        if device.type == "cuda":
            device_sleep(device, delay)
        buffer.div_(dist.get_world_size(group))
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            if device.type != "cuda":
                time.sleep(delay)
            return f.value()[0]

        return future.then(done)

    return gradsched.pipelined(hook)  # its one collective is issued inside the call: messages pipeline


def coordinator_of(model: Any) -> Any:
    return model._binder.coordinator


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): t.detach().float().cpu().clone() for n, t in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().nan_to_num(float("inf")).max().item() for n in b)


def mlp(width: int, depth: int, out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


class Net(nn.Module):
    """Convolutions with BatchNorm, and a layer the first ``unused_for`` forward passes leave
    unused (so the later ones are complete rounds a profile is made of)."""

    def __init__(self, unused_for: int = 0, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, 10)
        self.late = nn.Linear(10, 1)
        self.unused_for = unused_for
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.head(self.features(x))
        return out if self.calls <= self.unused_for else out + self.late(out)


def batches(device: torch.device, steps: int, size: int = 16, image: int = 16) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    return [(torch.randn(size, 3, image, image, generator=g).to(device),
             torch.randint(0, 10, (size,), generator=g).to(device)) for _ in range(steps)]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, after: Callable[[int], None] | None = None):
    for step, (x, y) in enumerate(data):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if after is not None:
            after(step)


def one_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
