"""Where the GPU check's timed parts lose time on a GPU: one NCCL rank, the settings of the
``overhead``, ``overlap`` and ``steady`` parts (benchmarks/gpucheck), each iteration's time,
the run's stats, the training thread's Python profile and a torch profiler trace of a few
iterations (open the .json files in https://ui.perfetto.dev).

On the lent machine, with .whl carried (as for the GPU check):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_profile.py --out $OUT

On CPU (the same code on gloo, small settings, to try it): ``--device cpu``. About two minutes
on a GPU. Writes ``profile.json`` (times and stats), ``python-profile.txt`` (the training
thread's most expensive functions per case) and ``traces.tar.gz``.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import os
import pstats
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as TorchDDP  # noqa: E402

import gradsched  # noqa: E402
from gpucheck.common import mlp, one_step, slow_link, sync, warm_up  # noqa: E402
from gpucheck.overlap import WIDE  # noqa: E402
from gpucheck.processes import free_port  # noqa: E402


class Case:
    """One model under one wrapper, stepped and timed one iteration at a time."""

    def __init__(self, name: str, model: nn.Module, step, device: torch.device):
        self.name, self.model, self.step, self.device = name, model, step, device

    def iterations(self, n: int, drain: bool = True) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            self.step()
            if drain:
                sync(self.device)
            times.append(time.perf_counter() - start)
        return times

    def profiled(self, n: int, out: Path, report: io.StringIO, trace: bool) -> None:
        """The training thread's Python profile over ``n`` iterations, then (``trace``) a torch
        profiler trace of 2 more."""
        sync(self.device)
        profile = cProfile.Profile()
        profile.enable()
        self.iterations(n)
        profile.disable()
        report.write(f"\n===== {self.name}: {n} iterations, by own time =====\n")
        pstats.Stats(profile, stream=report).sort_stats("tottime").print_stats(25)
        report.write(f"\n===== {self.name}: by cumulative time =====\n")
        pstats.Stats(profile, stream=report).sort_stats("cumulative").print_stats(25)
        if trace:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            # Python's calls on every thread (autograd's device thread runs the hooks on CUDA)
            with torch.profiler.profile(activities=activities, with_stack=self.device.type == "cuda") as prof:
                self.iterations(2)
            prof.export_chrome_trace(str(out / f"trace-{self.name}.json"))

    def stats(self) -> dict:
        stats = getattr(self.model, "stats", None)
        if stats is None:
            return {}
        return {k: v for k, v in stats.as_dict().items() if k in (
            "policy", "plan_policy", "rounds", "settled_round", "handed_off_round", "iteration_s", "exposed_s",
            "exposed_share", "plan_messages", "trial")}

    def close(self) -> None:
        if hasattr(self.model, "synchronize"):
            self.model.synchronize()
        if hasattr(self.model, "close"):
            self.model.close()


def overhead_cases(device: torch.device, cpu: bool):
    """The ``overhead`` part: ResNet-50, SGD with momentum, default options."""
    from gradsched.models.cnn import resnet50

    batch, size = (4, 32) if cpu else (64, 224)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    for name in ("ddp", "fifo", "bytescheduler", "prophet"):
        torch.manual_seed(0)
        module = resnet50().to(device)
        model = TorchDDP(module) if name == "ddp" else gradsched.DistributedDataParallel(module, policy=name)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, optimizer=optimizer):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        yield Case(f"overhead-{name}", model, step, device)


def link_cases(device: torch.device, cpu: bool):
    """The ``overlap`` and ``steady`` parts' setting: the MLP, and a slow link on the issuing side
    that delays each message by its share of half the iteration DDP takes without it."""
    width, depth, batch = (256, 4, 256) if cpu else (4096, 8, 8192)
    torch.manual_seed(0)
    base = mlp(width, depth, width).to(device)
    x = torch.randn(batch, width, device=device)
    nbytes = sum(p.numel() * p.element_size() for p in base.parameters())
    plain = TorchDDP(copy.deepcopy(base), bucket_cap_mb=25)
    optimizer = torch.optim.SGD(plain.parameters(), lr=1e-4)
    times = Case("plain", plain, lambda: one_step(plain, optimizer, x), device).iterations(3 + (4 if cpu else 8))[3:]
    compute = sorted(times)[len(times) // 2]
    del plain, optimizer
    for name, policy, options in (("link-ddp", None, None), ("link-fifo", "fifo", {}),
                                  ("link-bytescheduler", "bytescheduler", WIDE)):
        model = (TorchDDP(copy.deepcopy(base), bucket_cap_mb=25) if policy is None else
                 gradsched.DistributedDataParallel(copy.deepcopy(base), policy=policy, policy_options=options,
                                                   fallback=False, handoff=False))
        model.register_comm_hook(None, slow_link(device, 0.5 * compute / nbytes))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        yield Case(name, model, lambda model=model, optimizer=optimizer: one_step(model, optimizer, x), device), compute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu-profile"))
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    if not cpu:
        torch.cuda.set_device(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("gloo" if cpu else "nccl")
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    warm_up(device)
    report, results, started = io.StringIO(), {}, time.perf_counter()
    iters = 4 if cpu else 30
    for case in overhead_cases(device, cpu):
        times = case.iterations(3 + iters)
        case.profiled(3 if cpu else 10, args.out, report, trace=True)
        results[case.name] = {"iteration_ms": [round(t * 1e3, 2) for t in times], **case.stats()}
        case.close()
        print(f"{case.name}: median of the last {iters} {sorted(times[3:])[iters // 2] * 1e3:.1f} ms", flush=True)
        del case
        sync(device)
    for case, compute in link_cases(device, cpu):
        drained = case.iterations(3 + (4 if cpu else 8))
        sync(device)
        start = time.perf_counter()
        undrained = case.iterations(4 if cpu else 16, drain=False)
        sync(device)
        steady = (time.perf_counter() - start) / len(undrained)
        case.profiled(2 if cpu else 4, args.out, report, trace=True)
        results[case.name] = {"compute_ms": round(compute * 1e3, 2),
                              "delayed_drained_ms": [round(t * 1e3, 2) for t in drained],
                              "delayed_undrained_host_ms": [round(t * 1e3, 2) for t in undrained],
                              "delayed_undrained_per_iteration_ms": round(steady * 1e3, 2), **case.stats()}
        case.close()
        print(f"{case.name}: DDP without the delay {compute * 1e3:.1f} ms, delayed (drained) "
              f"{sorted(drained[3:])[len(drained[3:]) // 2] * 1e3:.1f} ms, undrained {steady * 1e3:.1f} ms", flush=True)
        del case
    dist.destroy_process_group()
    results["setting"] = {"device": torch.cuda.get_device_name(0) if not cpu else "cpu", "torch": torch.__version__,
                          "seconds": round(time.perf_counter() - started, 1)}
    (args.out / "profile.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "python-profile.txt").write_text(report.getvalue())
    with tarfile.open(args.out / "traces.tar.gz", "w:gz") as tar:
        for trace in sorted(args.out.glob("trace-*.json")):
            tar.add(trace, arcname=trace.name)
            trace.unlink()
    print(f"{results['setting']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
