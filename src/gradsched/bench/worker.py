"""One rank of ``gradsched bench``: ``python -m gradsched.bench.worker CONFIG_JSON``.

Started by the runner (inside a network namespace, or on loopback) with the usual
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``. For every policy it builds the
workload afresh, warms up and times iterations; then it times the same iterations without
any communication (compute only) and the communication alone (every gradient byte
all-reduced among the workers in DDP-sized buckets, no compute; with parameter servers also
pushed to the servers and pulled back), noting how busy the host's CPUs were in each. Rank 0
prints progress lines and one result line, each a JSON object after a marker the runner
looks for. With parameter servers the last ranks serve every policy in turn.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
import gradsched.runtime  # noqa: F401 - loaded at start, not mid-run
from gradsched.core.policies.fifo import assign_buckets
from gradsched.runtime.comm.compression import ddp_hook, wire_dtype
from gradsched.runtime.comm.plans import tensor_specs
from gradsched.runtime.planning.probe import cast_cost, probe_link
from gradsched.runtime.architectures.servers.pushpull import cut, message_tag

from .ddp_trace import DdpTracer
from .host import HostCpu
from .memory import RunMemory
from .protocol import COMM_ONLY, COMM_WIRE, COMPUTE_ONLY, MARK, SERVERS_ONLY, Run, WorkerConfig
from .config import FSDP2
from .straggler import Straggler
from .workloads import Pacer, ReplayOptimizer, local, workload

DDP_TUNED_CAPS_MB = (1, 4, 25, 100)
LINK_PERIODS = 8  # communication only lasts at least this many periods of a link's bursts
TRIAL_ROUNDS = 5
# communication only through servers: the gradients in about this many messages (within
# 1-16 MiB of float32 each), enough to overlap pushes with pulls, few enough not to time
# per-message costs
PS_PIECES, PS_PIECE_MIN, PS_PIECE_MAX = 32, 1 << 18, 1 << 22


def emit(kind: str, **fields) -> None:
    if dist.get_rank() == 0:
        print(MARK + json.dumps({"kind": kind, **fields}), flush=True)


def _stepper(model, optimizer, load, loss_fn, clip: float = 0.0):
    batch = load()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(batch[0]), batch[1]).backward()
        if clip:  # the same call under DDP and gradsched: it reads every reduced gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    return step


def bursting(step: Callable[[], None], pacer: Pacer, bursts: Straggler) -> Callable[[], None]:
    """``step`` with its replay paced ``bursts.factor`` times slower in the steps the bursts
    name (counted from the first call), as fast as profiled in the others."""
    count = itertools.count()

    def step_in_bursts() -> None:
        pacer.slowdown = bursts.factor if bursts.slow_at(next(count)) else 1.0
        step()

    return step_in_bursts


def _ddp(model, bucket_cap_mb: float, policy: str) -> DDP:
    """DDP, with a compression hook for ddp-bf16/ddp-fp16: PyTorch's own where it runs
    (bf16_compress_hook needs CUDA and NCCL), gradsched's equivalent otherwise."""
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    wire = policy.removeprefix("ddp-")
    if wire in ("bf16", "fp16"):
        cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
        hook = {"fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook if cuda else ddp_hook(torch.bfloat16)}[wire]
        ddp.register_comm_hook(None, hook)
    return ddp


def _zero(model: torch.nn.Module, template: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``template``'s optimizer as torch's ZeroRedundancyOptimizer (each rank steps and keeps the
    state of its share of the parameters, then broadcasts them)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(template, ReplayOptimizer):
        kwargs = {"pacer": template.pacer, "bytes_per_second": template.bytes_per_second}
    else:
        kwargs = dict(template.defaults)
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(template), **kwargs)


def _fully_shard(model: torch.nn.Module, reshard_after_forward: bool) -> None:
    """torch's FSDP2 as its documentation applies it: ``fully_shard`` on each block (a replay's
    layers, a real model's top-level modules with parameters), then on the whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    blocks = list(model.layers) if hasattr(model, "layers") else [m for m in model.children() if any(m.parameters())]
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer holds as state on this rank (measured, not computed)."""
    own = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer: its rank's own optimizer
    return sum(local(v).numel() * v.element_size() for state in own.state.values() for v in state.values()
               if torch.is_tensor(v))


class _Rank:
    """One rank's measurements, each on a freshly built, identically seeded model."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.servers = config.servers
        self.workers = world - self.servers
        self.group = dist.new_group(list(range(self.workers))) if self.servers else None  # every rank creates it
        straggler = config.straggler
        slower = 1.0 if straggler is None else straggler.compute_factor(self.rank)
        self.work = workload(config.model, config.batch, config.device, config.dilation * slower)
        # this rank slow in bursts: its replay's pacer slowed step by step (see step())
        self.bursts = straggler if straggler is not None and straggler.compute_bursts and straggler.rank == self.rank \
            else None
        self.pacer = None  # the latest fresh model's (a replay's)
        generator = torch.Generator().manual_seed(1 + self.rank)
        self.load = lambda: self.work.batch(generator)
        self.iters, self.warmup = config.iters, config.warmup
        self.memory = RunMemory()  # the run being measured: its peaks
        self.phases = len(config.runs) + (3 if self.servers else 2)  # the runs, then the baselines
        self.cpu: dict[str, float | None] = {}  # phase -> the host's CPU busy fraction over its timed steps

    def _timed(self, phase: str, step, iters: int, warmup, group=None) -> list[float]:
        """Seconds of each of ``iters`` steps after ``warmup`` untimed ones (a number, or a
        function asked after every step: a measured trial that measures more pairs grows it,
        alike on every rank), noting how busy the host's CPUs were over the timed steps (by
        phase: a policy, or a baseline)."""
        ran = 0
        while ran < (warmup() if callable(warmup) else warmup):
            step()
            ran += 1
        dist.barrier(group=group)
        cpu = HostCpu()
        cpu.start()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        cpu.stop()
        self.cpu[phase] = cpu.busy
        return times

    def fresh(self):
        torch.manual_seed(0)
        model = self.work.build()
        self.pacer = getattr(model, "pacer", None)
        return model, self.work.optimizer(model)

    def step(self, model, opt, run: Run | None = None):
        """One training step of the latest fresh model (wrapped as ``model``); where this rank is
        slow in bursts, its replay paced slower in the steps the bursts name, counted from this
        call's first step."""
        step = _stepper(model, opt, self.load, self.work.loss, run.clip if run is not None else 0.0)
        return step if self.bursts is None else bursting(step, self.pacer, self.bursts)

    def ddp(self, run: Run) -> dict:
        """DDP with 25 MB buckets, or (ddp-tuned) the fastest of several caps, re-measured;
        ddp-zero: with the optimizer's state sharded by torch's ZeroRedundancyOptimizer."""
        name = run.name
        caps = DDP_TUNED_CAPS_MB if run.policy == "ddp-tuned" else (25,)
        best = None
        for cap in caps:
            model, opt = self.fresh()
            if run.policy == "ddp-zero":
                opt = _zero(model, opt)
            ddp = _ddp(model, cap, run.policy)
            # traced where asked: plain DDP only (a compression hook is its own hook)
            tracer = DdpTracer(ddp, self.rank) if self.config.trace_dir and name == "ddp" else None
            times = self._timed(name, self.step(ddp, opt, run),
                                self.iters if len(caps) == 1 else max(3, self.iters // 3), self.warmup)
            if tracer is not None:
                tracer.save(f"{self.config.trace_dir}/{name}.json")
            if best is None or statistics.median(times) < best[0]:
                best = (statistics.median(times), cap, times, optimizer_state_bytes(opt))
        if len(caps) > 1:  # re-measure the winner over the full count
            model, opt = self.fresh()
            best = (0.0, best[1], self._timed(name, self.step(_ddp(model, best[1], run.policy), opt, run),
                                              self.iters, 1), best[3])
        return {"times": best[2], "bucket_cap_mb": best[1], "optimizer_state_bytes": best[3]}

    def fsdp(self, run: Run) -> dict:
        """FSDP2: ``fully_shard`` per block, resharding after forward (fsdp2) or not (fsdp2-noreshard)."""
        model, _ = self.fresh()
        _fully_shard(model, FSDP2[run.policy])
        opt = self.work.optimizer(model)  # over the sharded parameters
        times = self._timed(run.name, self.step(model, opt, run), self.iters, self.warmup)
        return {"times": times, "optimizer_state_bytes": optimizer_state_bytes(opt)}

    def gradsched(self, run: Run) -> dict | None:
        """A gradsched policy (None on a parameter server, which only served it)."""
        config = self.config
        model, opt = self.fresh()
        base, tune = run.policy, run.autotune_trials
        trace = f"{config.trace_dir}/{run.name}.json" if config.trace_dir else None
        ps = {"architecture": "ps", "servers": self.servers} if self.servers else run.architecture
        model, opt = gradsched.wrap(model, opt, base, trace=trace, profile_rounds=config.profile_rounds,
                                    compression=config.compression,
                                    fallback=config.fallback, trial_rounds=TRIAL_ROUNDS, autotune=bool(tune),
                                    autotune_trials=max(tune, 2), policy_options=config.options.get(base),
                                    plan_on_slow_rank=config.plan_on_slow_rank, **ps)
        if opt is None:
            return None
        # untimed: profiling and the measured arms (the buckets, tuner candidates; see
        # gradsched.control), then one round on the chosen plan
        times = self._timed(run.name, self.step(model, opt, run), self.iters,
                            lambda: self.warmup + opt.stats.settled_round, self.group)
        stats = opt.stats.as_dict()
        state = optimizer_state_bytes(opt)
        self.memory.stop()  # the run's peak: before close(), which may gather parameters whole again
        opt.close()
        return {"times": times, "plan": stats["plan_policy"], "plan_options": stats["plan_options"],
                "prediction": stats["prediction"],
                "trial": stats["trial"], "autotune": stats["autotune"], "optimizer_state_bytes": state,
                "ranks": stats["ranks"]}

    def _buckets(self) -> tuple[list[int], int]:
        """Elements of each 25 MiB bucket, as DDP sends them, and the gradient bytes."""
        model, _ = self.fresh()
        specs = tensor_specs([n for n, _ in model.named_parameters()], list(model.parameters()))
        by_name = {t.name: t for t in specs}
        sizes = [sum(by_name[n].numel for n in bucket) for bucket in assign_buckets(specs[::-1], 25 << 20, 25 << 20)]
        return sizes, sum(t.nbytes for t in specs)

    def baselines(self) -> dict | None:
        """Compute only (no communication); communication only (no compute): every gradient
        byte in 25 MiB buckets, as DDP sends them, all-reduced among the workers, which gives
        the link's rate and so the bound; with parameter servers also pushed to the servers
        and pulled back (``comm_servers``: what this host achieves for that traffic); and
        per-message costs (one tiny all-reduce at a time, and many in flight). Every rank
        takes part; a server returns None.

        Through servers the gradients travel in about 32 messages: one 25 MiB bucket would
        be pushed whole before any of it could be pulled, and time a one-way trip twice."""
        count, phases = len(self.config.runs), self.phases
        sizes, gradient_bytes = self._buckets()
        comm_iters = max(3, self.iters // 2)
        figures = {}
        if self.servers:
            emit("progress", policy=SERVERS_ONLY, index=count, total=phases)
            piece = min(max(sum(sizes) // PS_PIECES, PS_PIECE_MIN), PS_PIECE_MAX)
            pieces = [min(piece, n - start) for n in sizes for start in range(0, n, piece)]
            figures["comm_servers"] = self._timed(SERVERS_ONLY, self._push_pull(pieces), comm_iters, 2)
            if self.rank >= self.workers:
                return None
        emit("progress", policy=COMM_ONLY, index=phases - 2, total=phases)
        comm = self._comm_only(COMM_ONLY, [torch.zeros(n) for n in sizes], comm_iters)
        wire = wire_dtype(self.config.compression)
        if wire is not None:  # what the compressed runs' messages cost: the wire dtype's rate, and the casts
            figures["comm_wire"] = self._comm_only(COMM_WIRE, [torch.zeros(n, dtype=wire) for n in sizes], comm_iters)
            figures["cast_s_per_byte"] = cast_cost(wire)
        emit("progress", policy=COMPUTE_ONLY, index=phases - 1, total=phases)
        model, opt = self.fresh()
        compute = self._timed(COMPUTE_ONLY, self.step(model, opt), self.iters, self.warmup, self.group)
        link = probe_link(self.group, tiny_messages=64, repeats=20)  # its per-byte cost is not used
        return {"compute": compute, "comm": comm, "gradient_bytes": gradient_bytes, "world_size": self.workers,
                "latency": link.alone_s, "overhead": link.pipelined_s, "host_cpu": self.cpu, **figures}

    def _comm_only(self, phase: str, buckets: list[torch.Tensor], rounds: int) -> list[float]:
        """Seconds of each timed round of ``buckets`` all-reduced (after 2 untimed); with a link
        slowed in bursts by the clock, rounds added until they last :data:`LINK_PERIODS` of its
        periods (dilated), as many on every worker (each counts from its own times: the largest)."""
        communicate = self._all_reduce(buckets)
        times = self._timed(phase, communicate, rounds, 2, self.group)
        straggler = self.config.straggler
        if straggler is None or not straggler.link_bursts:
            return times
        period = straggler.period_s * self.config.dilation
        more = torch.tensor([max(0, math.ceil((LINK_PERIODS * period - sum(times)) / statistics.fmean(times)))])
        dist.all_reduce(more, op=dist.ReduceOp.MAX, group=self.group)
        return times + self._timed(phase, communicate, int(more.item()), 0, self.group)

    def _all_reduce(self, buckets: list[torch.Tensor]):
        """One round of communication only: every bucket all-reduced, all in flight at once."""

        def communicate() -> None:
            for work in [dist.all_reduce(b, group=self.group, async_op=True) for b in buckets]:
                work.wait()

        return communicate

    def _push_pull(self, sizes: list[int]):
        """One round of communication only through the parameter servers: every message
        (``sizes`` elements each, all in flight at once, so that pushing one overlaps pulling
        the one before, both directions of every link busy) is cut into one chunk per server,
        and chunks into pieces, as gradsched cuts them; each server sums each piece over the
        workers and sends it back."""
        workers, servers = range(self.workers), range(self.workers, self.workers + self.servers)
        if self.rank in workers:
            buffers = [(torch.zeros(n), torch.empty(n)) for n in sizes]

            def round_trip() -> None:
                works = []
                for k, (push, pull) in enumerate(buffers):
                    for server, chunk in zip(servers, cut(push.numel(), self.servers, push.element_size())):
                        for p, (a, b) in enumerate(chunk):
                            tag = message_tag(k, 0, p)
                            works += [dist.isend(push[a:b], server, tag=tag), dist.irecv(pull[a:b], server, tag=tag)]
                for work in works:
                    work.wait()

            return round_trip
        me = self.rank - self.workers

        def serve() -> None:
            received = {}
            for k, n in enumerate(sizes):
                for p, (a, b) in enumerate(cut(n, self.servers, torch.float32.itemsize)[me]):
                    tag = message_tag(k, 0, p)
                    received[tag] = [(buf, dist.irecv(buf, w, tag=tag)) for w in workers for buf in [torch.empty(b - a)]]
            sends = []
            for tag, slots in received.items():
                total = None
                for buffer, work in slots:
                    work.wait()
                    total = buffer if total is None else total.add_(buffer)
                sends += [dist.isend(total, w, tag=tag) for w in workers]
            for work in sends:
                work.wait()

        return serve


def run(config: WorkerConfig) -> None:
    dist.init_process_group("gloo")
    rank = _Rank(config)
    results: dict[str, dict] = {}
    for k, one in enumerate(config.runs):
        emit("progress", policy=one.name, index=k, total=rank.phases)
        rank.memory.start()
        result = rank.ddp(one) if one.is_ddp else rank.fsdp(one) if one.is_fsdp else rank.gradsched(one)
        if result is not None:
            results[one.name] = {**result, **rank.memory.stop()}
            # said at once: a run that times out later still tells what finished (dilated seconds)
            emit("finished", policy=one.name, median_s=statistics.median(result["times"]))
    baselines = rank.baselines()  # the servers take part in communication only
    if baselines is not None:
        emit("result", policies=results, **baselines)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(WorkerConfig.from_json(sys.argv[1]))
    # Leave without the interpreter's shutdown: gloo's teardown there aborts the process now
    # and then ("terminate called without an active exception"), even after every process
    # group was destroyed and with no gradsched object alive, which would fail a run whose
    # results are already out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
