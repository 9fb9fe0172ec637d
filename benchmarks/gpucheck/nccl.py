"""nccl: one NCCL rank, its reduction (the identity) made visible. A communication hook queues a
device sleep before the all-reduce and, behind the all-reduce's future, a sleep and a
multiplication by ``FACTOR``: the reduced gradient is ``FACTOR`` times the local one, and is in
place only once the device has run the work behind the future (NCCL completes the future when
the all-reduce is queued). Checked against the same arithmetic done here:

* a read of ``.grad`` right after ``backward()``;
* the parameters each module's forward sees after ``step()`` (SGD: gradsched updates each in
  the module's forward pre-hook);
* two backward passes before one step (``FACTOR * (FACTOR * g1 + g2)``);
* no value is NaN: before each message the hook fills freshly allocated memory like the
  message's buffer with NaN on the stream it runs on (the launcher's), so a buffer gradsched
  let go of while the device still read it would be handed out again and poisoned;
* packed messages: the model has a float64 layer between float32 ones, so a message that fuses
  across them (fifo's buckets, as DDP's, always; prophet's blocks when a measured plan puts
  them together) carries two dtypes and travels in copies (one per dtype) whose results are
  copied back behind the collective (their futures must carry the events of the copies: issue
  54). Four more backward passes (a measured plan from the second) read every gradient right
  after ``backward()``; the part counts the copied messages, and fails fifo's row without any.

On CPU the part runs on gloo with NCCL's semantics emulated (``GRADSCHED_EMULATE_NCCL``), where
a consumer that skips its event wait, or a completion that takes a done future for a reduced
message, fails it (tests/bench/test_gpu_check.py)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

import gradsched
from gpucheck.common import SMALL, device_sleep, mlp, row, sync

FACTOR = 4.0  # a power of two: the scaled values are exact
POLICIES = ("fifo", "bytescheduler", "prophet")
EMULATION = {"GRADSCHED_EMULATE_NCCL": "0.05"}  # its environment on CPU


def visible_hook(device: torch.device, before_s: float, after_s: float):
    """All-reduce, with a sleep before and a sleep and ``* FACTOR`` behind it (see the module's docstring)."""

    def hook(state, bucket):  # unannotated: DDP checks annotations against its own classes
        group = state if isinstance(state, dist.ProcessGroup) else None
        buffer = bucket.buffer()
        poison = [torch.full_like(buffer, float("nan")) for _ in range(4)]  # freed at once: reusable blocks, NaN
        del poison
        device_sleep(device, before_s)
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()

        def scaled(done: torch.futures.Future) -> torch.Tensor:
            device_sleep(device, after_s)
            return done.value()[0].mul_(FACTOR)

        return future.then(scaled)

    return gradsched.pipelined(hook)


class Mixed(nn.Module):
    """:func:`~gpucheck.common.mlp` with its middle layer in float64 (messages of two dtypes)."""

    def __init__(self, width: int, depth: int, out: int) -> None:
        super().__init__()
        self.layers = mlp(width, depth, out)
        self.middle = depth  # the layer (of 2 * depth + 1, ReLUs between) kept in float64
        self.layers[self.middle].double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x.double()).float() if k == self.middle else layer(x)
        return x

    def __iter__(self):
        return iter(self.layers)


def copied_messages(model: gradsched.DistributedDataParallel) -> int:
    """How many of the model's messages travelled in copies (the launcher counts them)."""
    return model._binder.coordinator.backend.exchange.launcher.copied_messages


def _rounds_read(base: nn.Module, policy: str, x: torch.Tensor, expected: list[torch.Tensor], device: torch.device,
                 before: float, after: float) -> tuple[float, bool, int]:
    """Four backward passes (a measured plan from the second), every gradient read right after
    each: (the largest difference from ``expected``, whether all were finite, the messages
    that travelled in copies)."""
    model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, policy_options=SMALL[policy],
                                              fallback=False, handoff=False, profile_rounds=1)
    model.register_comm_hook(None, visible_hook(device, before, after))
    reads = []
    for _ in range(4):
        model(x).pow(2).mean().backward()
        reads.append(_worst([p.grad.detach().clone() for p in model.parameters()], expected))
        model.zero_grad()
    copied = copied_messages(model)
    model.close()
    return max(d for d, _ in reads), all(f for _, f in reads), copied


def _gradients(model: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """The local gradients of ``model`` summed over one backward pass per input (no communication)."""
    model = copy.deepcopy(model)
    for x in inputs:
        model(x).pow(2).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _worst(read: list[torch.Tensor], expected: list[torch.Tensor]) -> tuple[float, bool]:
    finite = all(bool(torch.isfinite(r).all()) for r in read)
    return max((r - e).abs().nan_to_num(float("inf")).max().item() for r, e in zip(read, expected)), finite


def part_nccl(device: torch.device, quick: bool) -> list[dict]:
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    base = Mixed(512 if cuda else 64, 4, 64).to(device)
    x1, x2, x3 = (torch.randn(256 if cuda else 32, base.layers[0].in_features, device=device) for _ in range(3))
    before, after = (0.02, 0.02) if cuda else (0.01, 0.01)
    g1, g2 = _gradients(base, x1), _gradients(base, x2)
    lr = 0.5
    stepped = copy.deepcopy(base)  # what a forward pass after step() must see
    reference = torch.optim.SGD(stepped.parameters(), lr=lr)
    for p, g in zip(stepped.parameters(), g1):
        p.grad = g * FACTOR
    reference.step()
    after_step = [p.detach().clone() for p in stepped.parameters()]
    twice = [(a * FACTOR + b) * FACTOR for a, b in zip(g1, g2)]
    scale = max(g.abs().nan_to_num(float("inf")).max().item() for g in g1) * FACTOR
    tolerance = 1e-6 * scale
    rows = []
    for policy in (POLICIES[1:] if quick else POLICIES):
        checks = {}
        model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, policy_options=SMALL[policy],
                                                  fallback=False, handoff=False)
        model.register_comm_hook(None, visible_hook(device, before, after))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        seen: list[torch.Tensor] = []
        handles = [m.register_forward_pre_hook(lambda m, a: seen.extend(p.detach().clone() for p in m.parameters()))
                   for m in model.module if isinstance(m, nn.Linear)]  # after gradsched's: what forward uses
        model(x1).pow(2).mean().backward()
        checks["read right after backward"] = _worst([p.grad.detach().clone() for p in model.parameters()],
                                                     [g * FACTOR for g in g1])
        optimizer.step()
        seen.clear()  # (the first forward pass's)
        model(x3).pow(2).mean()  # a forward pass: each module updated before it runs
        checks["the forward pass after step() sees the update"] = _worst(seen, after_step)
        for h in handles:
            h.remove()
        optimizer.zero_grad(set_to_none=True)
        model.synchronize()
        copied = copied_messages(model)
        model.close()
        accumulating = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy,
                                                         policy_options=SMALL[policy], fallback=False, handoff=False)
        accumulating.register_comm_hook(None, visible_hook(device, before, after))
        accumulating(x1).pow(2).mean().backward()
        accumulating(x2).pow(2).mean().backward()  # adds to gradients reduced (or, on NCCL, queued) before
        checks["two backward passes before one step"] = _worst(
            [p.grad.detach().clone() for p in accumulating.parameters()], twice)
        copied += copied_messages(accumulating)
        accumulating.close()
        diff, finite, more = _rounds_read(base, policy, x1, [g * FACTOR for g in g1], device, before, after)
        copied += more
        sync(device)
        rows.append(row(f"nccl {policy} packed messages", diff <= tolerance and finite,
                        f"{copied} messages travelled in copies (float32 and float64 layers fused by a plan), their "
                        f"results copied back behind the collective; reads after 4 more backward passes: max |diff| "
                        f"{diff:.2e}; {'no NaN' if finite else 'NaN read'}", copied_messages=copied,
                        max_abs_diff=diff, finite=finite))
        for what, (diff, finite) in checks.items():
            rows.append(row(f"nccl {policy} {what}", diff <= tolerance and finite,
                            f"max |diff| {diff:.2e} from the values computed here (tolerance {tolerance:.1e}; "
                            f"unreduced ones are {FACTOR:.0f}x off); {'no NaN' if finite else 'NaN read'}",
                            max_abs_diff=diff, finite=finite))
    # fifo's buckets, as DDP's, hold both dtypes of the float64 layer's neighbourhood: copies for certain
    diff, finite, copied = _rounds_read(base, "fifo", x1, [g * FACTOR for g in g1], device, before, after)
    sync(device)
    rows.append(row("nccl fifo packed messages", diff <= tolerance and finite and copied > 0,
                    f"{copied} messages travelled in copies (a bucket of float32 and float64 gradients), their results "
                    f"copied back behind the collective; max |diff| {diff:.2e}; {'no NaN' if finite else 'NaN read'}",
                    copied_messages=copied, max_abs_diff=diff, finite=finite))
    return rows
