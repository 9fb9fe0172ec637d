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
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
import gradsched.runtime  # noqa: F401 - loaded at start, not mid-run
from gradsched.core.policies.fifo import assign_buckets
from gradsched.runtime.plans import tensor_specs
from gradsched.runtime.probe import probe_link

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


class _Rank:
    """One rank's measurements, each on a freshly built, identically seeded model."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.servers = config.get("servers", 0) if config.get("arch") == "ps" else 0
        self.workers = world - self.servers
        self.group = dist.new_group(list(range(self.workers))) if self.servers else None  # every rank creates it
        self.work = workload(config["model"], config["batch"], config["device"])
        generator = torch.Generator().manual_seed(1 + self.rank)
        self.load = lambda: self.work.batch(generator)
        self.iters, self.warmup = config["iters"], config["warmup"]

    def fresh(self):
        torch.manual_seed(0)
        model = self.work.build()
        return model, self.work.optimizer(model)

    def step(self, model, opt):
        return _stepper(model, opt, self.load, self.work.loss)

    def ddp(self, policy: str) -> dict:
        """DDP with 25 MB buckets, or (ddp-tuned) the fastest of several caps, re-measured."""
        caps = DDP_TUNED_CAPS_MB if policy == "ddp-tuned" else (25,)
        best = None
        for cap in caps:
            model, opt = self.fresh()
            times = _time(self.step(DDP(model, bucket_cap_mb=cap), opt),
                          self.iters if len(caps) == 1 else max(3, self.iters // 3), self.warmup)
            if best is None or statistics.median(times) < best[0]:
                best = (statistics.median(times), cap, times)
        if len(caps) > 1:  # re-measure the winner over the full count
            model, opt = self.fresh()
            best = (0.0, best[1], _time(self.step(DDP(model, bucket_cap_mb=best[1]), opt), self.iters, 1))
        return {"times": best[2], "bucket_cap_mb": best[1]}

    def gradsched(self, policy: str) -> dict | None:
        """A gradsched policy (None on a parameter server, which only served it)."""
        config = self.config
        model, opt = self.fresh()
        base, _, variant = policy.partition("+")
        tune = config.get("autotune_trials", 0) if variant == "autotune" else 0
        trace = f"{config['trace_dir']}/{policy}.json" if config.get("trace_dir") else None
        ps = {"architecture": "ps", "servers": self.servers, "exit_server": False} if self.servers else {}
        model, opt = gradsched.wrap(model, opt, base, trace=trace, profile_rounds=config["profile_rounds"],
                                    fallback=config["fallback"], trial_rounds=TRIAL_ROUNDS, autotune=bool(tune),
                                    autotune_trials=max(tune, 2), policy_options=config["options"].get(base), **ps)
        if opt is None:
            return None
        # untimed: profiling and the measured arms (the buckets, tuner candidates; see
        # gradsched.control), then one round on the chosen plan
        times = _time(self.step(model, opt), self.iters, self.warmup + opt.stats.settled_round, self.group)
        stats = opt.stats.as_dict()
        opt.close()
        return {"times": times, "plan": stats["plan_policy"], "prediction": stats["prediction"],
                "trial": stats["trial"], "autotune": stats["autotune"]}

    def baselines(self) -> dict:
        """Compute only (no communication), communication only (every gradient byte
        all-reduced among the workers in 25 MiB buckets, as DDP sends it, no compute; with
        parameter servers the runner turns this into the link's rate), and per-message costs
        (one tiny all-reduce at a time, and many in flight)."""
        count = len(self.config["policies"])
        emit("progress", policy="compute only", index=count, total=count + 2)
        model, opt = self.fresh()
        compute = _time(self.step(model, opt), self.iters, self.warmup, self.group)
        specs = tensor_specs([n for n, _ in model.named_parameters()], list(model.parameters()))
        emit("progress", policy="communication only", index=count + 1, total=count + 2)
        by_name = {t.name: t for t in specs}
        buckets = [torch.zeros(sum(by_name[n].numel for n in bucket))
                   for bucket in assign_buckets(specs[::-1], 25 << 20, 25 << 20)]

        def communicate() -> None:
            for work in [dist.all_reduce(b, group=self.group, async_op=True) for b in buckets]:
                work.wait()

        comm = _time(communicate, max(3, self.iters // 2), 2, self.group)
        link = probe_link(self.group, tiny_messages=64, repeats=20)  # its per-byte cost is not used
        return {"compute": compute, "comm": comm, "gradient_bytes": sum(t.nbytes for t in specs),
                "world_size": self.workers, "latency": link.alone_s, "overhead": link.pipelined_s}


def run(config: dict) -> None:
    dist.init_process_group("gloo")
    rank = _Rank(config)
    results: dict[str, dict] = {}
    for k, policy in enumerate(config["policies"]):
        emit("progress", policy=policy, index=k, total=len(config["policies"]) + 2)
        result = rank.ddp(policy) if policy in ("ddp", "ddp-tuned") else rank.gradsched(policy)
        if result is not None:
            results[policy] = result
    if rank.rank < rank.workers:  # parameter servers have nothing more to serve
        emit("result", policies=results, **rank.baselines())
    dist.destroy_process_group()


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
    # Leave without the interpreter's shutdown: gloo's teardown there aborts the process now
    # and then ("terminate called without an active exception"), even after every process
    # group was destroyed and with no gradsched object alive, which would fail a run whose
    # results are already out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
