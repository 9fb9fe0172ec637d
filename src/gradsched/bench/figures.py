"""The figures of a benchmark run: from rank 0's timings to the bound, each run's row (its
median, ratio to the bound, speed-up over the reference, the simulator's prediction for what
ran) and the setting they were measured in."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from ..core import MeasuredLink, policy_config
from ..core.base import PolicyConfig
from ..core.policies import FifoConfig, is_buckets
from ..sim import dependency_bound, link_cluster, predict, scaled
from ..sim.cluster import Cluster
from ..sim.predict import averaging
from ..sim.fsdp import fsdp_iteration_s
from .config import BASELINES, FSDP2, BenchConfig
from .protocol import COMM_ONLY, COMPUTE_ONLY, SERVERS_ONLY, Run
from .results import RankReport, RunReport
from .workloads import workload


@dataclass
class Row:
    """The figures of one run at one bandwidth (a row of the table; ``as_json`` is its record in
    the bench's JSON, the keys the committed figures use)."""

    policy: str  # the run's name (Run.name): a policy or baseline, and its variant
    bandwidth_gbps: float | None
    iteration_s: float  # the median iteration (the mean with a straggler's bursts)
    bound_s: float
    ratio_to_dependency_bound: float | None = None
    speedup_vs_ddp: float | None = None  # all-reduce: against DDP (or ddp-tuned)
    speedup_vs_fifo: float | None = None  # parameter servers: against fifo through them
    predicted_s: float | None = None  # the simulator's, for what ran
    host_cpu_busy: float | None = None
    periods: float | None = None  # a link slowed in bursts by the clock: how many of its periods the timed window lasted
    report: RunReport = field(default_factory=lambda: RunReport([]))  # what the rank reported of the run

    @property
    def ratio_to_bound(self) -> float:
        return self.iteration_s / self.bound_s

    def speedup(self, reference: str) -> float | None:
        return self.speedup_vs_fifo if reference == "fifo" else self.speedup_vs_ddp

    @property
    def plan(self) -> str:
        """What it ran at the end: the policy's plan, or a DDP baseline's bucket size."""
        if self.report.plan:
            return self.report.plan
        return f"buckets {self.report.bucket_cap_mb} MB" if self.report.bucket_cap_mb is not None else ""

    def as_json(self, with_servers: bool) -> dict[str, Any]:
        data = {"policy": self.policy, "bandwidth_gbps": self.bandwidth_gbps, "iteration_s": self.iteration_s,
                "bound_s": self.bound_s, "ratio_to_bound": self.ratio_to_bound,
                "ratio_to_dependency_bound": self.ratio_to_dependency_bound, "speedup_vs_ddp": self.speedup_vs_ddp}
        if with_servers:
            data["speedup_vs_fifo"] = self.speedup_vs_fifo
        data.update(predicted_s=self.predicted_s, host_cpu_busy=self.host_cpu_busy)
        if self.periods is not None:
            data["periods"] = self.periods
        return {**data, **self.report.described()}


@dataclass
class Setting:
    """The figures of one bandwidth."""

    bandwidth_bps: float | None
    limited: bool  # False: loopback without limit
    compute_s: float
    comm_s: float
    latency_s: float  # one tiny all-reduce
    overhead_s: float  # per message, many in flight
    rows: list[Row] = field(default_factory=list)
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

    modes: list[tuple[float, float]] | None = None  # a straggler's bursts: (share of iterations, compute s) each

    @property
    def bound_s(self) -> float:
        """max(compute, communication): of each iteration, and in bursts their mean."""
        return sum(weight * max(seconds, self.comm_s) for weight, seconds in self.modes or [(1.0, self.compute_s)])


def figures(config: BenchConfig, bandwidth: float | None, limited: bool, raw: RankReport) -> Setting:
    """The figures of one bandwidth from rank 0's ``raw`` result: the bound, and a row per run."""
    # every collective, and so every iteration, waits for the slowest rank: its compute is the cluster's
    modes = compute_modes(config, raw.compute)
    compute = sum(weight * seconds for weight, seconds in modes)  # the mean over a whole number of bursts
    typical_comm = _typical_comm(config)
    ring = typical_comm(raw.comm)
    # the link as measured: latency and per-message overhead from tiny messages, and the
    # cost per byte from the communication-only time (a ring all-reduce among the workers)
    link = MeasuredLink(raw.latency, raw.overhead, ring / raw.gradient_bytes)
    cluster = link_cluster(link, config.workers, config.servers)
    # with parameter servers every byte is pushed once and pulled once, each server link
    # carrying max(1, W/S) of a worker's share: the same bound as the simulator's
    comm = cluster.comm_time(raw.gradient_bytes) if config.with_servers else ring
    host_cpu = raw.host_cpu
    setting = Setting(bandwidth, limited, compute, comm, raw.latency, raw.overhead,
                      modes=modes if len(modes) > 1 else None, cpu_compute=host_cpu.get(COMPUTE_ONLY), cpu_comm=host_cpu.get(COMM_ONLY),
                      comm_servers_s=statistics.median(raw.comm_servers) if raw.comm_servers else None,
                      cpu_comm_servers=host_cpu.get(SERVERS_ONLY),
                      comm_wire_s=typical_comm(raw.comm_wire) if raw.comm_wire else None,
                      cast_s_per_byte=raw.cast_s_per_byte)
    predicting = _predicting(config, raw, setting, cluster)
    typical = statistics.median if config.straggler is None or config.straggler.steady else statistics.fmean
    medians = {p: typical(r.times) for p, r in raw.policies.items()}
    reference = medians.get("fifo") if config.with_servers else (medians.get("ddp") or medians.get("ddp-tuned"))
    work = workload(config.model, config.batch, config.device)
    if work.table is not None:
        setting.dependency_bound_s = sum(weight * dependency_bound(scaled(work.table, seconds), cluster.comm_time)
                                         for weight, seconds in modes)
    for policy, result in raw.policies.items():
        speedup = reference / medians[policy] if reference else None
        row = Row(policy, None if bandwidth is None else bandwidth / 1e9, medians[policy], setting.bound_s,
                  medians[policy] / setting.dependency_bound_s if setting.dependency_bound_s else None,
                  speedup_vs_ddp=None if config.with_servers else speedup,
                  speedup_vs_fifo=speedup if config.with_servers else None, host_cpu_busy=host_cpu.get(policy),
                  periods=_periods(config, result.times),
                  report=result)
        run = config.run_named(policy)
        base = run.policy
        # predict what actually ran (the simulator does not model clipping's wait for every reduction)
        if work.table is not None and base not in BASELINES and not run.clip:
            # the layers' times scaled so that compute matches the compute-only time (which
            # includes the optimizer step the table lacks): the prediction tests scheduling,
            # not the tc rate or the device preset
            table = work.table.on_the_wire(2) if config.compression else work.table
            ran = _ran(config, run, result, table.gradient_bytes / work.table.gradient_bytes)
            where = _bursty(config, link_cluster(link, config.workers, sharded=True)) \
                if run.sharded or run.fully_sharded else predicting
            if run.fully_sharded:  # the gathers' queue and the policy's reduce-scatters on one link
                where = replace(where, arch="fully_sharded")
            row.predicted_s = sum(weight * predict(scaled(table, seconds), where, ran) for weight, seconds in modes)
        elif work.table is not None and base in FSDP2 and not run.clip:  # FSDP2's own schedule (gradsched.sim.fsdp),
            # on the link averaged over the clock where it is slowed in bursts
            row.predicted_s = sum(weight * fsdp_iteration_s(scaled(work.table, seconds),
                                                            link_cluster(link, config.workers, sharded=True),
                                                            FSDP2[base]) for weight, seconds in modes)
        setting.rows.append(row)
    return setting


def _typical_comm(config: BenchConfig):
    """The statistic of communication alone's rounds: their median, or for a link slowed in bursts
    by the clock their mean over its many periods, the link's rate averaged over the clock, which
    every schedule's bytes meet alike (gradsched.bench.link_bursts)."""
    return statistics.fmean if config.straggler is not None and config.straggler.link_bursts else statistics.median


def _predicting(config: BenchConfig, raw: RankReport, setting: Setting, cluster: Cluster) -> Cluster:
    """Where gradsched's runs are predicted: on ``cluster``, the link measured; compressed ones on
    the wire dtype's rate, with casts; a link slowed in bursts as :func:`_bursty` models it."""
    if setting.comm_wire_s is not None:
        wire_link = MeasuredLink(raw.latency, raw.overhead, setting.comm_wire_s / (raw.gradient_bytes / 2),
                                 setting.cast_s_per_byte)
        cluster = link_cluster(wire_link, config.workers, config.servers)
    return _bursty(config, cluster)


def _bursty(config: BenchConfig, cluster: Cluster) -> Cluster:
    """``cluster`` (on the link as measured, averaged over the clock) as the simulator models a link
    slowed in bursts by the clock: the fast rate, slower in the straggler's bursts (undilated, as
    the figures are), the same rate on average; as it is without such bursts."""
    bursts = config.straggler.bursts if config.straggler is not None else None
    return cluster if bursts is None else averaging(cluster, bursts)


def _periods(config: BenchConfig, times: list[float]) -> float | None:
    """How many periods of a link's bursts by the clock ``times`` lasted (None: no such bursts)."""
    straggler = config.straggler
    return sum(times) / straggler.period_s if straggler is not None and straggler.link_bursts else None


def measured_setting(run: dict[str, Any], batch: int) -> tuple[Any, MeasuredLink]:
    """From a bench run's JSON (replay models): its model's layer table scaled to the compute
    measured alone, and the link measured (per-message costs, and the ring's time per gradient
    byte from communication alone), for the simulator to predict its rows again."""
    table = workload(run["model"], batch, "v100").table
    if table is None:
        raise ValueError(f"{run['model']} is not a replay model (no layer table to simulate)")
    setting = run["settings"][0]
    link = MeasuredLink(setting["message_latency_s"], setting["message_overhead_s"],
                        setting["comm_s"] / table.gradient_bytes)
    return scaled(table, setting["compute_s"]), link


def compute_modes(config: BenchConfig, rank0_compute: list[float]) -> list[tuple[float, float]]:
    """The cluster's compute time per iteration, as (share of iterations, seconds): one mode
    without a compute straggler, or throughout; a fast and a slow one with bursts. Rank 0 measured
    its own compute: a fast rank's (the median of its times), unless it is the straggler (its
    times then the slow rank's; in bursts, their mean over the whole periods timed).

    >>> from gradsched.bench.straggler import Straggler
    >>> compute_modes(BenchConfig(model="replay-mini"), [0.1, 0.1, 0.3])
    [(1.0, 0.1)]
    >>> compute_modes(BenchConfig(model="replay-mini", iters=4, straggler=Straggler(1, 2.0, slow=1, period=4)), [0.1] * 4)
    [(0.75, 0.1), (0.25, 0.2)]
    """
    straggler = config.straggler
    if straggler is None or straggler.link:
        return [(1.0, statistics.median(rank0_compute))]
    if straggler.steady:
        slow = statistics.median(rank0_compute) * (1.0 if straggler.rank == 0 else straggler.factor)
        return [(1.0, slow)]
    fast = statistics.fmean(rank0_compute) / straggler.mean_factor if straggler.rank == 0 \
        else statistics.median(rank0_compute)
    share = straggler.slow / straggler.period
    return [(1.0 - share, fast), (share, fast * straggler.factor)]


def _ran(config: BenchConfig, run: Run, result: RunReport, wire_ratio: float) -> PolicyConfig:
    """The policy configuration the run ended on (the fallback's buckets after losing its
    trial: DDP's, with caps scaled to wire bytes; tuned options)."""
    base = run.policy
    ran = result.plan or base
    if is_buckets(ran) and not is_buckets(base):
        return FifoConfig.ddp_buckets(wire_ratio=wire_ratio)
    options = config.policy_options(ran) if ran == base else {}
    tuned = (result.autotune or {}).get("best_options")
    if tuned and ran == base:
        options = {**options, **tuned}
    return policy_config(ran, **options)
