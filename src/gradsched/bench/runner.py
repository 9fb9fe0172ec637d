"""Runs the benchmark: an emulated cluster per bandwidth, the ranks, the figures.

For each bandwidth the runner builds the emulated cluster (or, where that is impossible,
uses loopback and says so), starts one worker per rank the way torchrun would (or, for
hosts of several ranks, one real torchrun per host, as users launch across hosts), shows
progress, and turns rank 0's timings into figures: the median iteration time of each
policy, the measured compute-only and communication-only times, the bound
max(compute, communication), the ratio to it, the speed-up over DDP, and, for replay
models, the simulator's prediction for the same setting on the measured link.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core import POLICIES, MeasuredLink, policy_config
from ..core.base import PolicyConfig
from ..core.policies import FifoConfig, is_buckets
from ..sim import dependency_bound, link_cluster, predict, scaled
from ..sim.bounds import raises_bound
from ..sim.fsdp import fsdp_iteration_s
from ..units import format_bytes
from .dilation import (AUTO_CPU_SHARE, AUTO_RAISES, AUTO_RUN_SHARE, auto_dilation, check_dilation, raised_dilation,
                       undilate)
from .netns import JUMBO_MTU, EmulatedCluster, available
from .processes import Processes, free_port, read_result, starts
from .protocol import COMM_ONLY, COMPUTE_ONLY, SERVERS_ONLY, Run, WorkerConfig
from .workloads import workload

# ddp-bf16/-fp16: DDP with a compression hook; ddp-zero: DDP with torch's ZeroRedundancyOptimizer;
# fsdp2: torch's fully_shard per layer (its default, resharding after forward), fsdp2-noreshard:
# reshard_after_forward=False (ZeRO-2-like)
FSDP2 = {"fsdp2": True, "fsdp2-noreshard": False}  # -> reshard_after_forward
BASELINES = ("ddp", "ddp-tuned", "ddp-bf16", "ddp-fp16", "ddp-zero", *FSDP2)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "mlp"
    workers: int = 2
    bandwidths_bps: tuple[float | None, ...] = (5e9,)  # None: no limit
    latency_s: float = 0.0
    policies: tuple[str, ...] = ("ddp", "fifo", "priority", "bytescheduler", "prophet")
    iters: int = 30
    warmup: int = 5
    batch: int = 32
    device: str = "v100"
    profile_rounds: int = 3
    trace_dir: str | None = None
    timeout_s: float = 1800.0
    loopback: bool = False  # force loopback (no namespaces, no limit)
    fallback: bool = True  # let gradsched fall back to DDP-style buckets where predicted better
    options: tuple[tuple[str, str, str], ...] = ()  # (policy, option, value), as --set gives them
    arch: str = "allreduce"  # or "ps": ``servers`` more ranks, each in its own namespace
    servers: int = 0
    autotune_trials: int = 0  # > 0: each tunable policy also runs as "POLICY+autotune"
    clip: float = 0.0  # > 0: ddp and each policy also run clipping gradients to this global norm ("+clip" rows)
    sharded: bool = False  # each gradsched policy also runs with architecture="sharded" ("+sharded" rows)
    compression: str | None = None  # "bf16"/"fp16": gradsched's policies run with wrap(compression=...)
    procs_per_node: int = 1  # ranks per emulated host (a namespace, one tc-limited link shared by its ranks)
    launcher: str = "direct"  # "direct": the runner starts every rank; "torchrun": one torchrun per host
    balance: bool = False  # measure at the bandwidth where compute and communication are equal, found
    #   by calibration runs starting from bandwidths_bps[0]
    dilation: float | str = 1.0  # time dilation K (gradsched.bench.dilation), or "auto"
    mtu: int = JUMBO_MTU  # frame size on the emulated links (gradsched.bench.netns)

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(f"workers must be >= 2 (communication needs two), got {self.workers}")
        if self.arch not in ("allreduce", "ps"):
            raise ValueError(f"arch must be allreduce or ps, got {self.arch!r}")
        if self.arch == "ps":
            if self.servers < 1:
                raise ValueError(f"--arch ps needs --servers >= 1, got {self.servers}")
            baselines = [p for p in self.policies if p in BASELINES]
            if baselines:
                raise ValueError(f"{', '.join(baselines)} use all-reduce; with --arch ps the reference is the fifo "
                                 "policy over the servers: drop them from --policy")
        elif self.servers:
            raise ValueError("--servers only applies to --arch ps")
        if self.sharded and self.arch != "allreduce":
            raise ValueError("--sharded runs beside all-reduce: drop --arch ps")
        if isinstance(self.procs_per_node, bool) or not isinstance(self.procs_per_node, int) \
                or self.procs_per_node < 1:
            raise ValueError(f"--procs-per-node must be a whole number >= 1, got {self.procs_per_node!r}")
        if self.ranks % self.procs_per_node:
            raise ValueError(f"{self.ranks} ranks do not fill hosts of {self.procs_per_node} processes")
        if self.launcher not in ("direct", "torchrun"):
            raise ValueError(f"launcher must be direct or torchrun, got {self.launcher!r}")
        if self.iters < 3 or self.warmup < 0:
            raise ValueError(f"iters must be >= 3 and warmup >= 0, got {self.iters} and {self.warmup}")
        unknown = [p for p in self.policies if p not in BASELINES]
        for name in unknown:
            policy_config(name, **self.policy_options(name))  # raises for unknown policies and options
        for policy, _, _ in self.options:
            if policy not in self.policies or policy in BASELINES:
                raise ValueError(f"--set {policy}.*: {policy!r} is not a gradsched policy being measured")
        if not self.policies:
            raise ValueError("no policy to measure")
        if self.balance and (len(self.bandwidths_bps) != 1 or self.bandwidths_bps[0] is None or self.loopback):
            raise ValueError("--balance finds one bandwidth on the emulated network, starting from --bandwidth: "
                             "drop --sweep-bandwidth and --loopback")
        if self.compression not in (None, "bf16", "fp16"):
            raise ValueError(f"--compression must be bf16 or fp16, got {self.compression!r}")
        if isinstance(self.mtu, bool) or not isinstance(self.mtu, int) or not 576 <= self.mtu <= 65535:
            raise ValueError(f"--mtu must be a frame size in 576..65535 bytes, got {self.mtu!r}")
        if not self.clip >= 0:
            raise ValueError(f"--clip must be a norm >= 0 (0: no clipping rows), got {self.clip}")
        if self.autotune_trials == 1 or self.autotune_trials < 0:
            raise ValueError(f"--autotune needs >= 2 trials (the defaults and a candidate), got {self.autotune_trials}")
        check_dilation(self.dilation, workload(self.model, self.batch, self.device).replay)  # unknown models raise

    @property
    def ranks(self) -> int:
        return self.workers + self.servers

    @property
    def hosts(self) -> int:
        """Emulated hosts: rank r runs on host r // procs_per_node."""
        return self.ranks // self.procs_per_node

    @property
    def runs(self) -> list[str]:
        """What is measured, in order: each policy, followed by its autotuned run and its
        run with clipping."""
        from ..tune.space import DEFAULT_RANGES

        runs = []
        for policy in self.policies:
            runs.append(policy)
            if self.autotune_trials and policy in DEFAULT_RANGES:
                runs.append(policy + "+autotune")
            if self.clip and policy in ("ddp", *POLICIES):
                runs.append(policy + "+clip")
            if self.sharded and policy in POLICIES:
                runs.append(policy + "+sharded")
        return runs

    @property
    def phases(self) -> int:
        """Measured phases per bandwidth: every run, then the baselines (computing only,
        communicating only, and through the servers with parameter servers)."""
        return len(self.runs) + (3 if self.arch == "ps" else 2)

    @property
    def reference(self) -> str:
        """What speed-ups are measured against."""
        return "fifo" if self.arch == "ps" else "ddp"

    def policy_options(self, policy: str) -> dict[str, str]:
        return {option: value for name, option, value in self.options if name == policy}


@dataclass
class Setting:
    """The figures of one bandwidth."""

    bandwidth_bps: float | None
    limited: bool  # False: loopback without limit
    compute_s: float
    comm_s: float
    latency_s: float  # one tiny all-reduce
    overhead_s: float  # per message, many in flight
    rows: list[dict[str, Any]] = field(default_factory=list)
    calibration: list[dict[str, float]] | None = None  # with --balance: the runs that found the bandwidth
    dependency_bound_s: float | None = None  # replay models: also respecting when gradients exist and are needed
    cpu_compute: float | None = None  # the host's CPUs busy (0-1) over compute only
    cpu_comm: float | None = None  # and over communication only
    comm_servers_s: float | None = None  # parameter servers: communication only, pushed and pulled through them
    cpu_comm_servers: float | None = None
    comm_wire_s: float | None = None  # --compression: communication only, the same buckets in the wire dtype
    cast_s_per_byte: float | None = None  # and casting to it and back, per wire byte
    dilation: float = 1.0  # the time dilation K it ran under (its times are divided by K)
    dilation_busy: float | None = None  # --dilation auto: the host's CPUs busy communicating only, undilated
    dilation_history: list[dict] | None = None  # --dilation auto: each dilated calibration's K and busiest run

    @property
    def bound_s(self) -> float:
        return max(self.compute_s, self.comm_s)


def _payload(config: BenchConfig, runs: Sequence[str] | None, iters: int | None) -> str:
    """What every rank is told to run (the worker's one argument)."""
    names = config.runs if runs is None else list(runs)
    return WorkerConfig(
        model=config.model, batch=config.batch, device=config.device, iters=iters or config.iters,
        warmup=config.warmup, runs=tuple(Run.named(n, config.clip, config.autotune_trials) for n in names),
        profile_rounds=config.profile_rounds, fallback=config.fallback,
        options={p: config.policy_options(p) for p in config.policies if p not in BASELINES},
        arch=config.arch, servers=config.servers if config.arch == "ps" else 0, compression=config.compression,
        dilation=float(config.dilation), trace_dir=config.trace_dir).to_json()


def _launch(config: BenchConfig, cluster: EmulatedCluster | None, progress: Callable[[dict], None],
            runs: Sequence[str] | None = None, iters: int | None = None) -> dict:
    """Run the ranks once: ``runs`` (default: every run of the config), then the baselines."""
    port = free_port() if cluster is None else 29500 + os.getpid() % 1000
    master = "127.0.0.1" if cluster is None else cluster.addresses[0]
    processes = Processes(cluster, config.launcher == "torchrun")
    watchdog = threading.Timer(config.timeout_s, processes.kill_all)
    watchdog.daemon = True
    reading, writing = os.pipe()  # rank 0's stdout: progress and the result
    try:
        worker = ["-m", "gradsched.bench.worker", _payload(config, runs, iters)]
        for start in starts(config.launcher == "torchrun", config.hosts, config.procs_per_node, cluster, worker, master,
                            port, writing):
            processes.start(*start)
        os.close(writing)
        writing = None
        watchdog.start()
        result = read_result(reading, progress)
        for proc in processes.procs:
            proc.wait()
        if processes.expired.is_set():
            raise TimeoutError(f"the benchmark ranks did not finish within {config.timeout_s:.0f} s (--timeout)")
        failure = processes.failure(result)
        if failure is not None:
            raise RuntimeError(failure)
        return result
    finally:
        watchdog.cancel()
        processes.close()
        os.close(reading)
        if writing is not None:
            os.close(writing)


def _figures(config: BenchConfig, bandwidth: float | None, limited: bool, raw: dict) -> Setting:
    compute = statistics.median(raw["compute"])
    ring = statistics.median(raw["comm"])
    # the link as measured: latency and per-message overhead from tiny messages, and the
    # cost per byte from the communication-only time (a ring all-reduce among the workers)
    link = MeasuredLink(raw["latency"], raw["overhead"], ring / raw["gradient_bytes"])
    cluster = link_cluster(link, config.workers, config.servers if config.arch == "ps" else 0)
    # with parameter servers every byte is pushed once and pulled once, each server link
    # carrying max(1, W/S) of a worker's share: the same bound as the simulator's
    comm = ring if config.arch == "allreduce" else cluster.comm_time(raw["gradient_bytes"])
    host_cpu = raw.get("host_cpu", {})
    setting = Setting(bandwidth, limited, compute, comm, raw["latency"], raw["overhead"],
                      cpu_compute=host_cpu.get(COMPUTE_ONLY), cpu_comm=host_cpu.get(COMM_ONLY),
                      comm_servers_s=statistics.median(raw["comm_servers"]) if "comm_servers" in raw else None,
                      cpu_comm_servers=host_cpu.get(SERVERS_ONLY),
                      comm_wire_s=statistics.median(raw["comm_wire"]) if "comm_wire" in raw else None,
                      cast_s_per_byte=raw.get("cast_s_per_byte"))
    predicting = cluster  # where gradsched's runs are predicted: compressed ones on the wire dtype's rate, with casts
    if setting.comm_wire_s is not None:
        wire_link = MeasuredLink(raw["latency"], raw["overhead"], setting.comm_wire_s / (raw["gradient_bytes"] / 2),
                                 setting.cast_s_per_byte)
        predicting = link_cluster(wire_link, config.workers, config.servers if config.arch == "ps" else 0)
    medians = {p: statistics.median(r["times"]) for p, r in raw["policies"].items()}
    reference = medians.get("fifo") if config.arch == "ps" else (medians.get("ddp") or medians.get("ddp-tuned"))
    work = workload(config.model, config.batch, config.device)
    if work.table is not None:
        setting.dependency_bound_s = dependency_bound(scaled(work.table, compute), cluster.comm_time)
    for policy, result in raw["policies"].items():
        row = {
            "policy": policy,
            "bandwidth_gbps": None if bandwidth is None else bandwidth / 1e9,
            "iteration_s": medians[policy],
            "bound_s": setting.bound_s,
            "ratio_to_bound": medians[policy] / setting.bound_s,
            "ratio_to_dependency_bound": medians[policy] / setting.dependency_bound_s if setting.dependency_bound_s else None,
            "speedup_vs_ddp": reference / medians[policy] if reference and config.arch == "allreduce" else None,
            **({"speedup_vs_fifo": reference / medians[policy] if reference else None} if config.arch == "ps" else {}),
            "predicted_s": None,
            "host_cpu_busy": host_cpu.get(policy),
            **{k: v for k, v in result.items() if k != "times"},
        }
        run = Run.named(policy)
        base = run.policy
        # predict what actually ran (the simulator does not model clipping's wait for every reduction)
        if work.table is not None and base not in BASELINES and not run.clip:
            # the layers' times scaled so that compute matches the compute-only time (which
            # includes the optimizer step the table lacks): the prediction tests scheduling,
            # not the tc rate or the device preset
            table = work.table.on_the_wire(2) if config.compression else work.table
            ran = _ran(config, policy, result, table.gradient_bytes / work.table.gradient_bytes)
            where = link_cluster(link, config.workers, sharded=True) if run.sharded else predicting
            row["predicted_s"] = predict(scaled(table, compute), where, ran)
        elif work.table is not None and base in FSDP2 and not run.clip:  # FSDP2's own schedule (gradsched.sim.fsdp)
            row["predicted_s"] = fsdp_iteration_s(scaled(work.table, compute),
                                                  link_cluster(link, config.workers, sharded=True), FSDP2[base])
        setting.rows.append(row)
    return setting


def _ran(config: BenchConfig, policy: str, result: dict, wire_ratio: float) -> PolicyConfig:
    """The policy configuration the run ended on (the fallback's buckets after losing its
    trial: DDP's, with caps scaled to wire bytes; tuned options)."""
    base = Run.named(policy).policy
    ran = result.get("plan") or base
    if is_buckets(ran) and not is_buckets(base):
        return FifoConfig.ddp_buckets(wire_ratio=wire_ratio)
    options = config.policy_options(ran) if ran == base else {}
    tuned = (result.get("autotune") or {}).get("best_options")
    if tuned and ran == base:
        options = {**options, **tuned}
    return policy_config(ran, **options)


CALIBRATION_ITERS = 8


def _measure(config: BenchConfig, bandwidth: float | None, progress: Callable[[dict], None], emulated: bool = True,
             runs: Sequence[str] | None = None, iters: int | None = None) -> dict:
    """One run of the ranks at ``bandwidth`` (on loopback unless ``emulated``), dilated by the
    config's K (links 1/K as fast, latency K times as long) and its times divided by K."""
    k = float(config.dilation)
    if not emulated:
        return undilate(_launch(config, None, progress, runs, iters), k)
    rate = None if bandwidth is None else bandwidth / k
    with EmulatedCluster(config.hosts, rate, config.latency_s * k, mtu=config.mtu) as cluster:
        return undilate(_launch(config, cluster, progress, runs, iters), k)


def choose_dilation(config: BenchConfig, progress: Callable[[str], None] | None = None
                    ) -> tuple[BenchConfig, float, list[dict]]:
    """``--dilation auto`` (gradsched.bench.dilation): communication alone once, undilated, at
    the fastest link of the config, for a first K; then the config's own runs at that K, K raised
    while the busiest keeps the host over the stated share. The config with the K chosen, the
    communication-only share and each dilated calibration's K and busiest share."""
    fastest = max((b for b in config.bandwidths_bps if b is not None), default=None)
    where = f" at {fastest / 1e9:.3g} Gbit/s" if fastest else ""
    if progress:
        progress(f"dilation: calibrating{where}, communication only")
    undilated = dataclasses.replace(config, dilation=1.0)
    raw = _measure(undilated, fastest, lambda message: None, runs=(), iters=CALIBRATION_ITERS)
    busy = raw.get("host_cpu", {}).get(COMM_ONLY)
    k, history = auto_dilation(busy), []
    for _ in range(AUTO_RAISES):
        if progress:
            progress(f"dilation: calibrating{where} at K={k}, the runs themselves")
        trying = dataclasses.replace(config, dilation=float(k))
        raw = _measure(trying, fastest, lambda message: None, iters=CALIBRATION_ITERS)
        shares = [raw.get("host_cpu", {}).get(run) for run in config.runs]
        busiest = max((s for s in shares if s is not None), default=None)
        history.append({"dilation": k, "host_cpu_busy_busiest_run": busiest})
        raised = raised_dilation(k, busiest)
        if raised is None:
            break
        k = raised
    return dataclasses.replace(config, dilation=float(k)), busy, history
BALANCED_WITHIN = 0.05  # calibration stops once compute and communication differ by less than this


def find_balance(config: BenchConfig, progress: Callable[[str], None] | None = None,
                 steps: int = 3) -> tuple[float, list[dict]]:
    """The bandwidth at which the measured communication-only time equals compute-only: a
    calibration run (baselines only) at the starting bandwidth, then at the bandwidth that
    would balance them if communication time were inversely proportional to bandwidth,
    until they are within 5%. Returns the bandwidth and every calibration's figures."""
    bandwidth = config.bandwidths_bps[0]
    history = []
    for step in range(steps):
        if progress:
            progress(f"balance: calibrating at {bandwidth / 1e9:.3g} Gbit/s (at most {steps} runs)")
        raw = _measure(config, bandwidth, lambda message: None, runs=(), iters=CALIBRATION_ITERS)
        setting = _figures(config, bandwidth, True, raw)
        history.append({"bandwidth_gbps": bandwidth / 1e9, "compute_s": setting.compute_s, "comm_s": setting.comm_s})
        ratio = setting.comm_s / setting.compute_s
        bandwidth *= ratio
        if abs(ratio - 1.0) < BALANCED_WITHIN:
            break
    return bandwidth, history


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None,
              warn: Callable[[str], None] | None = None) -> list[Setting]:
    ok, why = (False, "loopback was asked for") if config.loopback else available()
    if config.balance and not ok:
        raise RuntimeError(f"--balance needs the emulated network ({why})")
    if not ok and warn:
        warn(f"no emulated network ({why}): running on loopback WITHOUT a bandwidth limit")
    busy, dilation_history = None, None
    if config.dilation == "auto":
        config, busy, dilation_history = (choose_dilation(config, progress) if ok
                                          else (dataclasses.replace(config, dilation=1.0), None, None))
    calibration = None
    if config.balance:
        balanced, calibration = find_balance(config, progress)
        config = dataclasses.replace(config, bandwidths_bps=(balanced,))
    settings = []
    for b, bandwidth in enumerate(config.bandwidths_bps if ok else (None,)):
        label = "loopback" if not ok or bandwidth is None else f"{bandwidth / 1e9:g} Gbit/s"

        def show(message: dict, label=label) -> None:
            if progress:
                progress(f"{label}: {message['policy']}")

        raw = _measure(config, bandwidth if ok else None, show, emulated=ok)
        settings.append(_figures(config, bandwidth if ok else None, ok and bandwidth is not None, raw))
        settings[-1].calibration = calibration
        settings[-1].dilation, settings[-1].dilation_busy = float(config.dilation), busy
        settings[-1].dilation_history = dilation_history
    return settings


def settings_json(config: BenchConfig, settings: Sequence[Setting]) -> dict:
    work = workload(config.model, config.batch, config.device)
    return {
        "model": config.model,
        "replay": work.replay,
        "description": work.description,
        "workers": config.workers,
        "arch": config.arch,
        "servers": config.servers,
        "latency_s": config.latency_s,
        "compression": config.compression,
        "procs_per_node": config.procs_per_node,
        "launcher": config.launcher,
        "mtu": config.mtu,
        "dilation": settings[0].dilation if settings else 1.0,
        "dilation_auto": None if not settings or settings[0].dilation_busy is None else {
            "host_cpu_busy_comm_undilated": settings[0].dilation_busy, "target": AUTO_CPU_SHARE,
            "runs_target": AUTO_RUN_SHARE, "calibrations": settings[0].dilation_history},
        "emulated_network": all(s.limited for s in settings),
        "settings": [{"bandwidth_gbps": None if s.bandwidth_bps is None else s.bandwidth_bps / 1e9,
                      "compute_s": s.compute_s, "comm_s": s.comm_s, "bound_s": s.bound_s,
                      "dependency_bound_s": s.dependency_bound_s,
                      "message_latency_s": s.latency_s, "message_overhead_s": s.overhead_s,
                      "host_cpu_busy_compute": s.cpu_compute, "host_cpu_busy_comm": s.cpu_comm,
                      "comm_servers_s": s.comm_servers_s, "host_cpu_busy_comm_servers": s.cpu_comm_servers,
                      "comm_wire_s": s.comm_wire_s, "cast_s_per_byte": s.cast_s_per_byte,
                      "balance_calibration": s.calibration} for s in settings],
        "results": [row for s in settings for row in s.rows],
    }


def _dependency_note(s: Setting) -> str:
    if not raises_bound(s.dependency_bound_s, s.bound_s):
        return ""
    return (f" ({s.dependency_bound_s * 1e3:.1f} ms respecting when gradients exist and are needed: "
            f"best {min(row['iteration_s'] for row in s.rows) / s.dependency_bound_s:.3f}x of it)")


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def settings_text(config: BenchConfig, settings: Sequence[Setting]) -> str:
    work = workload(config.model, config.batch, config.device)
    lines = []
    for s in settings:
        where = f"{s.bandwidth_bps / 1e9:.3g} Gbit/s per link (tc)" if s.limited else "loopback, NO bandwidth limit"
        if s.calibration:
            where += ", the balance point (" + " -> ".join(
                f"{c['bandwidth_gbps']:.3g} Gbit/s: compute {c['compute_s'] * 1e3:.0f} / comm {c['comm_s'] * 1e3:.0f} ms"
                for c in s.calibration) + ")"
        arch = f" + {config.servers} parameter servers" if config.arch == "ps" else ""
        hosts = f" on {config.hosts} hosts of {config.procs_per_node}" if config.procs_per_node > 1 else ""
        hosts += ", one torchrun per host" if config.launcher == "torchrun" else ""
        lines.append(f"{config.model}{' [REPLAY]' if work.replay else ''} · {config.workers} workers{arch}{hosts} · {where}"
                     + (f" · latency {config.latency_s * 1e3:g} ms" if config.latency_s else ""))
        lines.append(f"  {work.description}")
        if s.dilation != 1 or s.dilation_busy is not None:
            tried = "; ".join(f"K={c['dilation']:g}: busiest run {_percent(c['host_cpu_busy_busiest_run'])}"
                              for c in s.dilation_history or [])
            chosen = "" if s.dilation_busy is None else (
                f" (auto: communicating only kept the host {s.dilation_busy:.0%} busy undilated, target "
                f"{AUTO_CPU_SHARE:.0%}; the runs themselves, target {AUTO_RUN_SHARE:.0%}: {tried or 'not measured'})")
            lines.append(f"  time dilation K={s.dilation:g}{chosen}: replayed compute x{s.dilation:g}, links at "
                         f"1/{s.dilation:g} of the rate, latency x{s.dilation:g}; every time shown divided by K "
                         "(per-message CPU, Python and TCP timers are not scaled)")
        if config.compression:
            lines.append(f"  compression: gradsched's policies send {config.compression} (the bound is for uncompressed "
                         "gradients; ddp-bf16/ddp-fp16 are DDP with the matching compression hook)")
        lines.append(f"  measured: compute only {s.compute_s * 1e3:.1f} ms, communication only {s.comm_s * 1e3:.1f} ms,"
                     f" bound {s.bound_s * 1e3:.1f} ms{_dependency_note(s)}; per message {s.latency_s * 1e3:.2f} ms alone,"
                     f" {s.overhead_s * 1e3:.2f} ms pipelined")
        if s.comm_wire_s is not None:
            lines.append(f"  compressed: communication only {s.comm_wire_s * 1e3:.1f} ms in {config.compression},"
                         f" casts {s.cast_s_per_byte * 1e9:.3g} ns per wire byte each way (the predictions use both)")
        if s.comm_servers_s is not None:
            lines.append(f"  through the servers: communication only {s.comm_servers_s * 1e3:.1f} ms"
                         f" ({s.comm_servers_s / s.comm_s:.2f}x the link's time for these bytes)")
        busy = [f"{_percent(cpu)} {what}" for cpu, what in ((s.cpu_compute, "computing only"),
                (s.cpu_comm, "communicating only"), (s.cpu_comm_servers, "through the servers")) if cpu is not None]
        if busy:
            lines.append(f"  host CPUs busy: {', '.join(busy)} (the ranks and the network's kernel work share them)")
        versus = f"vs {config.reference}"
        width = max([14] + [len(row["policy"]) for row in s.rows])
        lines.append(f"  {'policy':<{width}} {'iter ms':>9} {'x bound':>8} {versus:>7} {'predicted':>10} {'cpu':>4}  plan")
        for row in s.rows:
            predicted = f"{row['predicted_s'] * 1e3:8.1f}ms" if row.get("predicted_s") else f"{'-':>10}"
            gain = row.get(f"speedup_vs_{config.reference}")
            speedup = f"{gain:6.3f}x" if gain else f"{'-':>7}"
            plan = row.get("plan") or (f"buckets {row['bucket_cap_mb']} MB" if "bucket_cap_mb" in row else "")
            tuned = (row.get("autotune") or {}).get("best_options")
            if tuned and not is_buckets(plan):
                plan += " (" + ", ".join(f"{k}={format_bytes(v) if k.endswith('_bytes') else f'{v:.3g}'}"
                                         for k, v in tuned.items()) + ")"
            lines.append(f"  {row['policy']:<{width}} {row['iteration_s'] * 1e3:9.1f} {row['ratio_to_bound']:8.3f} "
                         f"{speedup} {predicted} {_percent(row.get('host_cpu_busy')):>4}  {plan}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
