"""The GPU check: what gradsched's CUDA path must do, on one GPU, in one run (a few minutes).

    python benchmarks/gpu_check.py [--json FILE] [--quick]
    python benchmarks/gpu_check.py --device cpu [--quick]   # the same checks on CPU and gloo

NCCL allows one rank per GPU, so the checks that need two ranks run them on gloo with CUDA
tensors on the same GPU, and the NCCL checks run one rank (a real NCCL communicator and
stream, world size 1). Every part runs in processes of its own, started here.

  (a) streams (NCCL, 1 rank): gradients produced on a side stream behind a long
      ``torch.cuda._sleep``, reduced (also compressed to fp16), read on a third stream right
      after ``backward()``: the values read are the reduced gradients, not what the buffers
      held before;
  (b) end to end (NCCL, 1 rank), every policy against PyTorch's DDP on the same GPU: autocast
      with GradScaler (SGD with clipping; fused AdamW through the DDP drop-in), BatchNorm, an
      unused parameter, join(), export_profile; ``device_ids`` moving CPU inputs to the GPU;
  (c) two gloo ranks with CUDA tensors on the one GPU, training under a side stream, every
      policy against DDP;
  (d) in (c), prophet's measured profile and its trial's iteration times against CUDA-event
      times of the same iterations;
  (e) overhead against DDP on ResNet-50 (1 rank): time per iteration and max_memory_allocated.

It prints a table and writes the figures as JSON; exit status 1 if a check failed. With
``--device cpu`` the same code runs where it applies (no streams, a small CNN for (e)), which
is how the test suite keeps the script itself working on machines without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gradsched.bench.processes import free_port
from gradsched.control import ControlSchedule
from gradsched.models.table import ModelTable

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
TOLERANCE = 1e-5
TRIAL = dict(profile_rounds=3, trial_rounds=3)  # (c) and (d): the policy's arm, then the buckets'
SCHEDULE = ControlSchedule(TRIAL["profile_rounds"], TRIAL["trial_rounds"], replan_every=50, arms=2)
SLEEP_CYCLES = 200_000_000  # about 0.1-0.2 s of a GPU's clock: the side stream's head start


# -- processes -------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, port: int, backend: str, device: str, part: str, quick: bool,
               out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    dist.init_process_group(backend)
    try:
        result = PARTS[part](torch.device(device, 0) if device == "cuda" else torch.device("cpu"), quick)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def run_part(part: str, world: int, backend: str, device: str, quick: bool, timeout_s: float = 240) -> list[dict]:
    """Run one part on ``world`` fresh processes; its rows (a failed or hung part is one failed row)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        context = mp.start_processes(_rank_main, (world, free_port(), backend, device, part, quick, out), world,
                                     join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    return [row(part, False, f"did not finish within {timeout_s:.0f} s")]
        except Exception as exc:  # noqa: BLE001 - a rank raised: reported as the part's failure
            return [row(part, False, f"a rank failed: {str(exc)[-1500:]}")]
        with open(out) as f:
            return json.load(f)


def row(check: str, ok: bool | None, detail: str, **figures: Any) -> dict:
    return {"check": check, "ok": ok, "detail": detail, **figures}


# -- models and training loops ---------------------------------------------------------------
class Net(nn.Module):
    """Convolutions with BatchNorm, and a layer the first ``unused_for`` forward passes leave
    unused (so the later ones are complete rounds a profile is made of)."""

    def __init__(self, unused_for: int = 0) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)
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


def amp_steps(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, device: torch.device,
              clip: float | None, stream: Any = None, marks: list | None = None,
              after_backward: Callable[[], None] | None = None) -> None:
    """Train with autocast and GradScaler inside join(); clip after unscale_ if ``clip``."""
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    join = model.join() if hasattr(model, "join") else None
    with join if join is not None else contextlib.nullcontext():
        for x, y in data:
            if marks is not None:  # (when, its event) before and after each forward pass
                marks.append([_mark(device, stream)])
            with _on(stream), torch.autocast(device.type, dtype=dtype):
                out = model(x)
            if marks is not None:
                marks[-1].append(_mark(device, stream))
            with _on(stream), torch.autocast(device.type, dtype=dtype):
                loss = nn.functional.cross_entropy(out, y)
            with _on(stream):
                scaler.scale(loss).backward()
            if after_backward:
                after_backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


def _on(stream: Any) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): t.detach().float().cpu().clone() for n, t in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in b)


def optimizer_for(kind: str, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    if kind == "fused-adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


# -- (a) streams -----------------------------------------------------------------------------
def part_streams(device: torch.device, quick: bool) -> list[dict]:
    rows = []
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
    x = torch.randn(256, 512, device=device)
    reference = copy.deepcopy(base)
    reference(x).pow(2).mean().backward()
    expected = [p.grad.detach().clone() for p in reference.parameters()]
    for compression, tolerance in ((None, 1e-6), ("fp16", 1e-2)):  # relative to the largest gradient
        for policy in ("bytescheduler", "prophet"):
            model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, compression=compression)
            side = torch.cuda.Stream() if device.type == "cuda" else None
            consumer = torch.cuda.Stream() if device.type == "cuda" else None
            if side is not None:
                side.wait_stream(torch.cuda.current_stream())
            with _on(side):
                if side is not None:
                    torch.cuda._sleep(SLEEP_CYCLES)  # the gradients are written long after the launch
                model(x).pow(2).mean().backward()
            with _on(consumer):
                read = [p.grad.detach().clone() for p in model.parameters()]
            if consumer is not None:
                consumer.synchronize()
            diff = max((r - e).abs().max().item() for r, e in zip(read, expected))
            scale = max(e.abs().max().item() for e in expected)
            rows.append(row(f"(a) streams {policy} {compression or 'fp32'}", diff <= tolerance * scale,
                            f"read on a third stream: max |diff| {diff:.2e} (gradients up to {scale:.2e})",
                            max_abs_diff=diff))
            model.close()
    return rows


# -- (b) end to end --------------------------------------------------------------------------
def part_end_to_end(device: torch.device, quick: bool) -> list[dict]:
    steps = 6 if quick else 12
    data = batches(device, steps)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, clip in (("sgd", 1.0), ("fused-adamw", None)):
            torch.manual_seed(0)
            initial = Net(unused_for=steps // 2).to(device)
            reference = TorchDDP(copy.deepcopy(initial), find_unused_parameters=True)
            amp_steps(reference, optimizer_for(kind, reference, device), data, device, clip)
            expected = state(reference)
            for policy in POLICIES:
                model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy,
                                                          find_unused_parameters=True, profile_rounds=2)
                unused: list[bool] = []  # after each backward pass: the unused layer's .grad is None

                def look() -> None:
                    unused.append(model.module.late.weight.grad is None)

                amp_steps(model, optimizer_for(kind, model, device), data, device, clip, after_backward=look)
                path = model.export_profile(os.path.join(tmp, f"{policy}-{kind}.json"))
                layers = len(ModelTable.load(path).layers)
                diff = max_diff(state(model), expected)
                settled = unused == [True] * (steps // 2) + [False] * (steps - steps // 2)
                rows.append(row(f"(b) end to end {policy} {kind}", diff <= TOLERANCE and settled and layers > 0,
                                f"against DDP: max |diff| {diff:.2e}; unused layer's .grad None while unused: "
                                f"{settled}; profile of {layers} layers", max_abs_diff=diff))
                model.close()
    rows.append(_inputs_moved(device))
    return rows


def _inputs_moved(device: torch.device) -> dict:
    """``device_ids=[device]``: CPU inputs (nested in args and kwargs) reach the module on the
    device, as DDP moves them."""
    seen: list[torch.device] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x, pair, extra=None):
            seen.extend(t.device for t in (x, *pair, extra["t"]))
            return self.lin(x)

    model = gradsched.DistributedDataParallel(Probe().to(device), device_ids=[device], policy="fifo")
    model(torch.ones(3, 4), (torch.ones(1), torch.ones(1)), extra={"t": torch.ones(1)}).sum().backward()
    model.close()
    ok = all(d.type == device.type for d in seen) and len(seen) == 4
    return row("(b) device_ids moves the inputs", ok, f"inputs reached the module on {sorted({str(d) for d in seen})}")


# -- (c) and (d): two gloo ranks on one GPU ----------------------------------------------------
def part_two_ranks(device: torch.device, quick: bool) -> list[dict]:
    steps = 14 if quick else 24
    data = batches(device, steps, *((256, 64) if device.type == "cuda" else (16, 16)))  # on a GPU: compute to time
    side = torch.cuda.Stream() if device.type == "cuda" else None
    torch.manual_seed(0)
    initial = Net(unused_for=2).to(device)
    reference = TorchDDP(copy.deepcopy(initial), find_unused_parameters=True)
    amp_steps(reference, optimizer_for("sgd", reference, device), data, device, 1.0, stream=side)
    expected = state(reference)
    rows = []
    for policy in POLICIES:
        # gradsched's own data plane throughout (no hand-off to DDP's reducer), one trial pair: short
        model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy, find_unused_parameters=True,
                                                  **TRIAL, trial_pairs=1, handoff=False)
        marks: list = []
        amp_steps(model, optimizer_for("sgd", model, device), data, device, 1.0, stream=side, marks=marks)
        diff = max_diff(state(model), expected)
        rows.append(row(f"(c) two gloo ranks {policy}", diff <= TOLERANCE,
                        f"CUDA tensors under a side stream, against DDP: max |diff| {diff:.2e}", max_abs_diff=diff))
        if policy == "prophet":
            rows += _times_against_events(model, marks, device)
        model.close()
    return rows


def _mark(device: torch.device, stream: Any) -> tuple[float, Any]:
    """The time now, and on CUDA an event on ``stream`` (or the current one)."""
    if device.type != "cuda":
        return time.perf_counter(), None
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return time.perf_counter(), event


def _seconds(a: tuple[float, Any], b: tuple[float, Any]) -> float:
    return b[0] - a[0] if a[1] is None else a[1].elapsed_time(b[1]) / 1e3


def _times_against_events(model: Any, marks: list, device: torch.device) -> list[dict]:
    """(d): the trial's iteration times and the profile's forward passes against event-timed ones."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    forward = statistics.median(_seconds(*m) for m in marks[len(marks) // 2:])
    trial = model.stats.trial
    rows = []
    if trial is not None:
        # each arm against the event-timed iterations of the very rounds it measured (round r:
        # from its forward pass to the next one; marks[r - 1] is round r's forward pass)
        timed = [statistics.median(_seconds(marks[r - 1][0], marks[r][0]) for r in range(first, last + 1))
                 for first, last in map(SCHEDULE.measured_rounds, (0, 1))]
        ratios = [trial.policy_s / timed[0], trial.fifo_s / timed[1]]
        rows.append(row("(d) trial times against events", all(0.5 <= r <= 1.5 for r in ratios),
                        f"trial {trial.policy_s * 1e3:.1f} / buckets {trial.fifo_s * 1e3:.1f} ms; event-timed "
                        f"{timed[0] * 1e3:.1f} / {timed[1] * 1e3:.1f} ms (ratios {ratios[0]:.2f} / {ratios[1]:.2f})",
                        ratio=max(ratios, key=lambda r: abs(r - 1.0))))
    else:
        rows.append(row("(d) trial times against events", False, "no trial was measured"))
    with tempfile.TemporaryDirectory() as tmp:
        table = ModelTable.load(model.export_profile(os.path.join(tmp, "p.json")))
    profiled = sum(layer.forward_s for layer in table.layers)
    ratio = profiled / forward
    # On CPU this small model's forward pass is mostly the hooks' own work, which the profile
    # leaves out: the figure is shown, not judged.
    rows.append(row("(d) profile against events", 0.5 <= ratio <= 1.5 if device.type == "cuda" else None,
                    f"profiled forward pass {profiled * 1e3:.2f} ms, event-timed {forward * 1e3:.2f} ms "
                    f"(ratio {ratio:.2f})", ratio=ratio))
    return rows


# -- (e) overhead ----------------------------------------------------------------------------
def part_overhead(device: torch.device, quick: bool) -> list[dict]:
    from gradsched.models.cnn import resnet50

    cuda = device.type == "cuda"
    batch, size, iters = (64, 224, 30) if cuda else (4, 32, 6)
    if quick:
        iters = max(iters // 2, 4)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    rows = []
    baseline = None
    for name in ("ddp", *POLICIES):
        torch.manual_seed(0)
        module = resnet50().to(device)
        model = TorchDDP(module) if name == "ddp" else gradsched.DistributedDataParallel(module, policy=name)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for i in range(iters + 3):
            start = time.perf_counter()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= 3:
                times.append(time.perf_counter() - start)
        if hasattr(model, "synchronize"):
            model.synchronize()
        seconds = statistics.median(times)
        peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        baseline = baseline or (seconds, peak)
        rows.append(row(f"(e) overhead {name}", None,
                        f"{seconds * 1e3:.1f} ms per iteration ({seconds / baseline[0]:.2f}x DDP)"
                        + (f", peak {peak / 2**20:.0f} MiB ({peak / max(baseline[1], 1):.2f}x DDP)" if cuda else ""),
                        iteration_s=seconds, max_memory_allocated=peak))
        if hasattr(model, "close"):
            model.close()
        del model, module, optimizer
        if cuda:
            torch.cuda.empty_cache()
    return rows


PARTS = {"streams": part_streams, "end_to_end": part_end_to_end, "two_ranks": part_two_ranks,
         "overhead": part_overhead}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", help="write the rows and the setting here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu for the CPU version of the checks",
              file=sys.stderr)
        return 2
    backend = "nccl" if args.device == "cuda" else "gloo"
    started = time.monotonic()
    rows = []
    for part, world, part_backend in (("streams", 1, backend), ("end_to_end", 1, backend),
                                      ("two_ranks", 2, "gloo"), ("overhead", 1, backend)):
        print(f"gpu_check: {part} ({world} rank{'s' if world > 1 else ''}, {part_backend}) ...", file=sys.stderr)
        rows += run_part(part, world, part_backend, args.device, args.quick)
    setting = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "gradsched": gradsched.__version__, "seconds": time.monotonic() - started}
    width = max(len(r["check"]) for r in rows)
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "    "}[r["ok"]]
        print(f"{r['check']:<{width}}  {verdict}  {r['detail']}")
    print(f"{setting['device']}, torch {setting['torch']}: {setting['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setting": setting, "rows": rows}, f, indent=1)
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
