"""One rank of ``gradsched bench``: ``python -m gradsched.bench.worker CONFIG_JSON``.

Started by the runner (inside a network namespace, or on loopback) with the usual
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``. For every policy it builds the
workload afresh, warms up and times iterations; then it times the same iterations without
any communication (compute only) and the communication alone (every gradient byte
all-reduced among the workers in DDP-sized buckets, no compute). Rank 0
prints progress lines and one result line, each a JSON object after a marker the runner
looks for. With parameter servers the last ranks serve every policy in turn.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
import gradsched.runtime  # noqa: F401 - loaded at start, not mid-run

from .protocol import MARK
from .workloads import workload

DDP_TUNED_CAPS_MB = (1, 4, 25, 100)
TRIAL_ROUNDS = 5


def emit(kind: str, **fields) -> None:
    if dist.get_rank() == 0:
        print(MARK + json.dumps({"kind": kind, **fields}), flush=True)


def _time(step, iters: int, warmup: int, group=None) -> list[float]:
    for _ in range(warmup):
        step()
    dist.barrier(group=group)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def _stepper(model, optimizer, load, loss_fn):
    batch = load()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(batch[0]), batch[1]).backward()
        optimizer.step()

    return step


def run(config: dict) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    servers = config.get("servers", 0) if config.get("arch") == "ps" else 0
    workers = world - servers
    group = dist.new_group(list(range(workers))) if servers else None  # every rank creates it
    ps_options = {"architecture": "ps", "servers": servers, "exit_server": False} if servers else {}
    work = workload(config["model"], config["batch"], config["device"])
    generator = torch.Generator().manual_seed(1 + rank)
    load = lambda: work.batch(generator)  # noqa: E731
    iters, warmup = config["iters"], config["warmup"]
    results: dict[str, dict] = {}

    def fresh():
        torch.manual_seed(0)
        model = work.build()
        return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    for k, policy in enumerate(config["policies"]):
        emit("progress", policy=policy, index=k, total=len(config["policies"]) + 2)
        detail: dict = {}
        if policy in ("ddp", "ddp-tuned"):
            caps = DDP_TUNED_CAPS_MB if policy == "ddp-tuned" else (25,)
            best = None
            for cap in caps:
                model, opt = fresh()
                ddp = DDP(model, bucket_cap_mb=cap)
                times = _time(_stepper(ddp, opt, load, work.loss), iters if len(caps) == 1 else max(3, iters // 3),
                              warmup)
                median = statistics.median(times)
                if best is None or median < best[0]:
                    best = (median, cap, times)
                del ddp, model, opt
            if len(caps) > 1:  # re-measure the winner over the full count
                model, opt = fresh()
                ddp = DDP(model, bucket_cap_mb=best[1])
                best = (0.0, best[1], _time(_stepper(ddp, opt, load, work.loss), iters, 1))
                del ddp, model, opt
            times, detail = best[2], {"bucket_cap_mb": best[1]}
        else:
            model, opt = fresh()
            base, _, variant = policy.partition("+")
            tune = config.get("autotune_trials", 0) if variant == "autotune" else 0
            trace = f"{config['trace_dir']}/{policy}.json" if config.get("trace_dir") else None
            model, opt = gradsched.wrap(model, opt, base, trace=trace, profile_rounds=config["profile_rounds"],
                                        fallback=config["fallback"], trial_rounds=TRIAL_ROUNDS,
                                        autotune=bool(tune), autotune_trials=max(tune, 2),
                                        policy_options=config["options"].get(base), **ps_options)
            if opt is None:  # a parameter server: it served this policy's run
                continue
            # untimed: profiling and the measured arms (the buckets, tuner candidates; see
            # gradsched.runtime.planning), then one round on the chosen plan
            settle = opt.stats["settled_round"]
            times = _time(_stepper(model, opt, load, work.loss), iters, warmup + settle, group)
            stats = opt.stats
            detail = {"plan": stats["plan_policy"], "prediction": stats["prediction"], "trial": stats["trial"],
                      "autotune": stats["autotune"]}
            opt.close()
            del model, opt
        results[policy] = {"times": times, **detail}

    if rank >= workers:  # a parameter server: nothing more to serve
        dist.destroy_process_group()
        return

    # compute only: the same iterations, no communication at all
    emit("progress", policy="compute only", index=len(config["policies"]), total=len(config["policies"]) + 2)
    model, opt = fresh()
    compute = _time(_stepper(model, opt, load, work.loss), iters, warmup, group)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sizes = [p.numel() for p in model.parameters()][::-1]
    del model, opt

    emit("progress", policy="communication only", index=len(config["policies"]) + 1,
         total=len(config["policies"]) + 2)
    # every gradient byte all-reduced among the workers in 25 MiB buckets, as DDP sends it
    # (with parameter servers the runner turns this into the link's rate)
    buckets, current = [], 0
    for n in sizes:
        current += n
        if current * 4 >= 25 << 20:
            buckets.append(torch.zeros(current))
            current = 0
    if current:
        buckets.append(torch.zeros(current))

    def communicate() -> None:
        for work_ in [dist.all_reduce(b, group=group, async_op=True) for b in buckets]:
            work_.wait()

    comm = _time(communicate, max(3, iters // 2), 2, group)

    # per-message costs: one tiny all-reduce at a time (latency), then many in flight at
    # once (the serial cost per message that pipelining does not hide)
    tiny = [torch.zeros(16) for _ in range(64)]
    latency = _time(lambda: dist.all_reduce(tiny[0], group=group), 20, 3, group)
    pipelined = _time(lambda: [w.wait() for w in [dist.all_reduce(t, group=group, async_op=True) for t in tiny]],
                      5, 1, group)
    emit("result", policies=results, compute=compute, comm=comm, gradient_bytes=gradient_bytes,
         world_size=workers, latency=statistics.median(latency), overhead=statistics.median(pipelined) / len(tiny))
    dist.destroy_process_group()


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
