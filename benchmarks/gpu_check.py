"""The GPU check: what gradsched's CUDA path must do, on one GPU, each part able to fail.

    python benchmarks/gpu_check.py [--parts a,b,...] [--quick] [--json FILE]
    python benchmarks/gpu_check.py --device cpu [--quick]   # the same code on CPU and gloo

NCCL allows one rank per GPU, so the parts that need a reduction that is not the identity run
two gloo ranks with CUDA tensors on the one GPU; the others run one NCCL rank (a real
communicator and stream). Every part runs in processes of its own, with its own time limit,
forked from a server that imported torch once and never touched CUDA (multiprocessing's
forkserver): fresh processes, without an interpreter's start-up per part.

  reduction     2 ranks, different data: gradients produced on a side stream behind a long
                ``torch.cuda._sleep``, read on a third stream right after ``backward()``,
                against the average computed here, every policy, fp32 and fp16 on the wire;
                and over a slow link (a communication hook that delays each message), where
                a result taken before the reduction ended cannot pass. The communication
                threads' streams and the stream the hook ran on are not the default stream.
  overlap       1 rank, a slow link (each message delayed in proportion to its bytes on the
                communication side): the share of the delay hidden behind backward, gradsched
                against DDP with the same hook (DDP runs hooks on the training stream).
  profile       1 rank, a layer that sleeps a known time in forward and in backward: found
                with those times in the exported profile (device times, not host ones).
  handoff       2 ranks, the buckets kept and handed to DDP's reducer: gradsched's flat
                buffers freed (weak references, and CUDA memory against DDP's), values
                equal to DDP's.
  host_syncs    1 rank, torch.profiler: CUDA synchronizations per iteration on the training
                thread against DDP's; gradsched's Python calls per iteration.
  sync_bn       2 ranks (CUDA only): a SyncBatchNorm model (the user's collectives on the
                default group while gradsched's run on its own) against DDP.
  end_to_end    1 rank, every policy against DDP: autocast with GradScaler (SGD with clipping;
                fused AdamW), BatchNorm, an unused parameter, join(), export_profile, and
                ``device_ids`` moving CPU inputs (world size 1: values here are smoke, the
                reduction part checks reduction).
  overhead      1 rank, ResNet-50: time per iteration and peak memory against DDP.

Rows judged only where the device makes the judgement mean something (the CUDA-only ones show
``-`` on CPU). Exit status 1 if a check failed. tests/bench/test_gpu_check.py runs the CPU
version and, with planted defects (tests/mutant), shows the reduction rows failing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gradsched.bench.processes import free_port
from gradsched.models.table import ModelTable

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
SMALL = {"fifo": {}, "priority": {"partition_bytes": 1 << 16},
         "bytescheduler": {"partition_bytes": 1 << 16, "credit_bytes": 1 << 18},
         "prophet": {"partition_bytes": 1 << 16, "credit_bytes": 1 << 18, "fuse_bytes": 1 << 17}}
TOLERANCE = 1e-5
SLEEP_CYCLES = 200_000_000  # about 0.1-0.2 s of a GPU's clock: the side stream's head start


# -- processes -------------------------------------------------------------------------------
class Part(NamedTuple):
    run: Callable[[torch.device, bool], list[dict]]
    world: int
    gloo: bool  # gloo even on CUDA (two ranks on one GPU); else NCCL on CUDA
    timeout_s: float


def _rank_main(rank: int, world: int, port: int, backend: str, device: str, part: str, quick: bool,
               out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group(backend)
    try:
        result = PARTS[part].run(torch.device(device, 0) if device == "cuda" else torch.device("cpu"), quick)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def run_part(part: str, device: str, quick: bool) -> list[dict]:
    """Run one part on fresh processes; its rows (a failed or hung part is one failed row)."""
    spec = PARTS[part]
    backend = "gloo" if spec.gloo or device == "cpu" else "nccl"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        context = mp.start_processes(_rank_main, (spec.world, free_port(), backend, device, part, quick, out),
                                     spec.world, join=False, start_method="forkserver")
        deadline = time.monotonic() + spec.timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    return [row(part, False, f"did not finish within {spec.timeout_s:.0f} s")]
        except Exception as exc:  # noqa: BLE001 - a rank raised: reported as the part's failure
            return [row(part, False, f"a rank failed: {str(exc)[-1500:]}")]
        with open(out) as f:
            return json.load(f)


def row(check: str, ok: bool | None, detail: str, **figures: Any) -> dict:
    return {"check": check, "ok": ok, "detail": detail, **figures}


def judged(device: torch.device, ok: bool) -> bool | None:
    """``ok`` on CUDA; None (shown, not judged) on CPU."""
    return ok if device.type == "cuda" else None


# -- shared pieces ---------------------------------------------------------------------------
def _on(stream: Any) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CYCLES_PER_S: list[float] = []


def cycles_per_second(device: torch.device) -> float:
    """What ``torch.cuda._sleep`` sleeps per cycle here, measured with events."""
    if not _CYCLES_PER_S:
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
    return max((a[n] - b[n]).abs().max().item() for n in b)


def mlp(width: int, depth: int, out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


# -- reduction -------------------------------------------------------------------------------
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
    scale = max(e.abs().max().item() for e in expected)
    own = max((p.grad - e).abs().max().item() for p, e in zip(reference.parameters(), expected))  # the last rank's
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
        diff = max((r - e).abs().max().item() for r, e in zip(read, expected))
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
    side, consumer = _stream(device), _stream(device)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with _on(side):
        if side is not None:
            torch.cuda._sleep(SLEEP_CYCLES)  # the gradients are written long after the launch
        model(x).pow(2).mean().backward()
    if consumer is not None and side is not None:
        consumer.wait_stream(side)  # what a user's stream does to see backward's gradients
    with _on(consumer):
        read = [p.grad.detach().clone() for p in model.parameters()]
    _sync(device)
    return read


def _streams_row(model: Any, seen: list, device: torch.device) -> dict:
    """The launcher's and the completion's threads, and the hook calls, ran off the default stream."""
    launcher = coordinator_of(model).plane.exchange.launcher
    streams = [launcher.stream, *getattr(launcher.completion, "streams", [])]
    if device.type != "cuda":
        return row("reduction streams of the communication threads", None, "no streams on CPU")
    default = torch.cuda.default_stream(device)
    off = all(s is not None and s != default for s in streams + seen) and len(set(streams)) == len(streams)
    return row("reduction streams of the communication threads", off,
               f"launcher {launcher.stream}, completion {streams[1:]}, hook calls on "
               f"{sorted({str(s) for s in seen})}; default {default}")


# -- overlap ---------------------------------------------------------------------------------
def part_overlap(device: torch.device, quick: bool) -> list[dict]:
    cuda = device.type == "cuda"
    width, depth, batch = (4096, 8, 8192) if cuda else (256, 4, 256)
    iters = (6 if quick else 12) if cuda else 4
    torch.manual_seed(0)
    base = mlp(width, depth, width).to(device)
    x = torch.randn(batch, width, device=device)
    nbytes = sum(p.numel() * p.element_size() for p in base.parameters())
    times = {}
    for name in ("ddp", "gradsched"):
        for delayed in (False, True):  # undelayed first: the delay is made of its time
            if name == "ddp":
                model = TorchDDP(copy.deepcopy(base), bucket_cap_mb=25)
            else:
                model = gradsched.DistributedDataParallel(copy.deepcopy(base), policy="bytescheduler",
                                                          policy_options={"partition_bytes": 8 << 20,
                                                                          "credit_bytes": 32 << 20},
                                                          fallback=False, handoff=False)
            per_byte = 0.0
            if delayed:  # the delay in all: half of the undelayed iteration
                per_byte = 0.5 * times[name, False] / nbytes
            model.register_comm_hook(None, slow_link(device, per_byte))
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
            times[name, delayed] = _iteration_s(model, optimizer, x, iters, device)
            if hasattr(model, "close"):
                model.close()
            del model, optimizer
    rows = []
    hidden = {}
    for name in ("ddp", "gradsched"):
        total = 0.5 * times[name, False]
        hidden[name] = 1.0 - (times[name, True] - times[name, False]) / total
    rows.append(row("overlap slow link hidden behind backward", judged(device, hidden["gradsched"] >= 0.5),
                    f"gradsched hides {hidden['gradsched']:.0%} of a delay of half its iteration "
                    f"({times['gradsched', False] * 1e3:.1f} -> {times['gradsched', True] * 1e3:.1f} ms); DDP with the "
                    f"same hook {hidden['ddp']:.0%} ({times['ddp', False] * 1e3:.1f} -> {times['ddp', True] * 1e3:.1f} ms)",
                    hidden=hidden["gradsched"], ddp_hidden=hidden["ddp"],
                    times_s={f"{n}{'+delay' if d else ''}": t for (n, d), t in times.items()}))
    return rows


def _iteration_s(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, iters: int,
                 device: torch.device) -> float:
    """Median time of one iteration, the device drained after each (warm-up iterations left out)."""
    times = []
    for i in range(iters + 2):
        _sync(device)
        start = time.perf_counter()
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if hasattr(model, "synchronize"):
            model.synchronize()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- profile ---------------------------------------------------------------------------------
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


# -- handoff ---------------------------------------------------------------------------------
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


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, after: Callable[[int], None] | None = None):
    for step, (x, y) in enumerate(data):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if after is not None:
            after(step)


def part_handoff(device: torch.device, quick: bool) -> list[dict]:
    steps = 16
    data = batches(device, steps)
    torch.manual_seed(0)
    initial = Net(width=256).to(device)
    reference = TorchDDP(copy.deepcopy(initial))
    _train(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9), data)
    _sync(device)
    ddp_memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    expected = state(reference)
    del reference
    model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy="prophet", profile_rounds=2,
                                              trial_rounds=3, trial_pairs=1, fallback_gain=0.99)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    co = coordinator_of(model)
    flat: dict[int, tuple[weakref.ref, int]] = {}  # every flat buffer gradsched made, while it trains itself

    def look(step: int) -> None:
        if co.backend is co.plane:  # gradsched's own plane still reduces
            for layout in list(co.plane.exchange._layouts._made.values()):
                for home in layout.homes.values():
                    base = home._base if home._base is not None else home
                    flat.setdefault(id(base), (weakref.ref(base), base.numel() * base.element_size()))

    _train(model, optimizer, data, look)
    model.synchronize()
    gc.collect()
    _sync(device)
    memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
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
        ratio = memory / max(ddp_memory, 1)
        rows.append(row("handoff memory against DDP", ratio <= 1.05,
                        f"{memory / 2**20:.1f} MiB allocated after the hand-off, DDP {ddp_memory / 2**20:.1f} MiB "
                        f"({ratio:.2f}x)", ratio=ratio))
    return rows


# -- host synchronizations -----------------------------------------------------------------------
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
            _step(model, optimizer, x)
        _sync(device)
        ours = {t.native_id for t in threading.enumerate() if t.name.startswith("gradsched-")}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(iters):
                _step(model, optimizer, x)
        _sync(device)
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


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


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
            _step(model, optimizer, x)
    finally:
        sys.setprofile(None)
    return count[0] / iters


# -- SyncBatchNorm ---------------------------------------------------------------------------
def part_sync_bn(device: torch.device, quick: bool) -> list[dict]:
    if device.type != "cuda":
        return [row("sync_bn against DDP", None, "SyncBatchNorm needs CUDA tensors")]
    data = batches(device, 8)
    torch.manual_seed(0)
    initial = nn.SyncBatchNorm.convert_sync_batchnorm(Net()).to(device)
    reference = TorchDDP(copy.deepcopy(initial))
    _train(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9), data)
    expected = state(reference)
    rows = []
    for policy in ("fifo", "prophet"):
        model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy, fallback=False)
        _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data)
        diff = max_diff(state(model), expected)
        rows.append(row(f"sync_bn {policy} against DDP", diff <= TOLERANCE, f"max |diff| {diff:.2e}",
                        max_abs_diff=diff))
        model.close()
    return rows


# -- end to end ------------------------------------------------------------------------------
def amp_steps(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, device: torch.device,
              clip: float | None, after_backward: Callable[[], None] | None = None) -> None:
    """Train with autocast and GradScaler inside join(); clip after unscale_ if ``clip``."""
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    join = model.join() if hasattr(model, "join") else None
    with join if join is not None else contextlib.nullcontext():
        for x, y in data:
            with torch.autocast(device.type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if after_backward:
                after_backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


def optimizer_for(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "fused-adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def part_end_to_end(device: torch.device, quick: bool) -> list[dict]:
    steps = 6 if quick else 12
    data = batches(device, steps)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, clip in (("sgd", 1.0), ("fused-adamw", None)):
            torch.manual_seed(0)
            initial = Net(unused_for=steps // 2).to(device)
            reference = TorchDDP(copy.deepcopy(initial), find_unused_parameters=True)
            amp_steps(reference, optimizer_for(kind, reference), data, device, clip)
            expected = state(reference)
            for policy in POLICIES:
                model = gradsched.DistributedDataParallel(copy.deepcopy(initial), policy=policy,
                                                          find_unused_parameters=True, profile_rounds=2)
                unused: list[bool] = []  # after each backward pass: the unused layer's .grad is None

                def look() -> None:
                    unused.append(model.module.late.weight.grad is None)

                amp_steps(model, optimizer_for(kind, model), data, device, clip, after_backward=look)
                path = model.export_profile(os.path.join(tmp, f"{policy}-{kind}.json"))
                layers = len(ModelTable.load(path).layers)
                diff = max_diff(state(model), expected)
                settled = unused == [True] * (steps // 2) + [False] * (steps - steps // 2)
                rows.append(row(f"end_to_end {policy} {kind}", diff <= TOLERANCE and settled and layers > 0,
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

    ids = [device] if device.type == "cuda" else None
    model = gradsched.DistributedDataParallel(Probe().to(device), device_ids=ids, policy="fifo")
    model(torch.ones(3, 4), (torch.ones(1), torch.ones(1)), extra={"t": torch.ones(1)}).sum().backward()
    model.close()
    ok = all(d.type == device.type for d in seen) and len(seen) == 4
    return row("end_to_end device_ids moves the inputs", ok,
               f"inputs reached the module on {sorted({str(d) for d in seen})}")


# -- overhead --------------------------------------------------------------------------------
def part_overhead(device: torch.device, quick: bool) -> list[dict]:
    from gradsched.models.cnn import resnet50

    cuda = device.type == "cuda"
    batch, size, iters = (64, 224, 30) if cuda else (4, 32, 6)
    warmup = 3
    if quick:  # on CPU nothing here is judged: the rows only show the part runs
        iters, warmup = (15, 3) if cuda else (2, 1)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    rows = []
    baseline = None
    for name in ("ddp", *POLICIES):
        torch.manual_seed(0)
        module = resnet50().to(device)
        model = TorchDDP(module) if name == "ddp" else gradsched.DistributedDataParallel(module, policy=name)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for i in range(iters + warmup):
            start = time.perf_counter()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        if hasattr(model, "synchronize"):
            model.synchronize()
        seconds = statistics.median(times)
        peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        baseline = baseline or (seconds, peak)
        ratio, memory = seconds / baseline[0], peak / max(baseline[1], 1)
        rows.append(row(f"overhead {name}", judged(device, ratio <= 1.10 and memory <= 1.5) if name != "ddp" else None,
                        f"{seconds * 1e3:.1f} ms per iteration ({ratio:.2f}x DDP)"
                        + (f", peak {peak / 2**20:.0f} MiB ({memory:.2f}x DDP)" if cuda else ""),
                        iteration_s=seconds, max_memory_allocated=peak))
        if hasattr(model, "close"):
            model.close()
        del model, module, optimizer
        if cuda:
            torch.cuda.empty_cache()
    return rows


PARTS = {
    "reduction": Part(part_reduction, 2, True, 150),
    "overlap": Part(part_overlap, 1, False, 90),
    "profile": Part(part_profile, 1, False, 60),
    "handoff": Part(part_handoff, 2, True, 90),
    "host_syncs": Part(part_host_syncs, 1, False, 60),
    "sync_bn": Part(part_sync_bn, 2, True, 60),
    "end_to_end": Part(part_end_to_end, 1, False, 120),
    "overhead": Part(part_overhead, 1, False, 120),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and cases")
    parser.add_argument("--json", help="write the rows and the setting here")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu for the CPU version of the checks",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    mp.set_forkserver_preload(["__main__", "torch", "torch.distributed", "torch._dynamo", "gradsched.runtime"])
    rows = []
    for part in parts:
        spec = PARTS[part]
        part_started = time.monotonic()
        print(f"gpu_check: {part} ({spec.world} rank{'s' if spec.world > 1 else ''}, limit {spec.timeout_s:.0f} s) ...",
              file=sys.stderr, flush=True)
        got = run_part(part, args.device, args.quick)
        for r in got:
            r["part"], r["part_s"] = part, time.monotonic() - part_started
        rows += got
    setting = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "gradsched": gradsched.__version__, "parts": parts,
               "mutant": os.environ.get("GRADSCHED_MUTANT"), "seconds": time.monotonic() - started}
    width = max(len(r["check"]) for r in rows)
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "  - "}[r["ok"]]
        print(f"{r['check']:<{width}}  {verdict}  {r['detail']}")
    print(f"{setting['device']}, torch {setting['torch']}: {setting['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setting": setting, "rows": rows}, f, indent=1)
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
