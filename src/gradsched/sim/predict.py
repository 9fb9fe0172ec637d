"""Predictions for a measured setting: the one place that turns measurements of a real link
(and, optionally, of real compute) into a simulated steady-state iteration time.

The runtime uses it for the prediction it reports next to its measured trial, the bench
for the prediction next to every measured row, and the tuner for every offline trial.

>>> from gradsched.models.table import Layer, ModelTable, ParamSpec
>>> from gradsched.core import policy_config
>>> table = ModelTable("two", (Layer("a", 1e-3, 2e-3, (ParamSpec("a.w", 250_000),)),
...                            Layer("b", 1e-3, 2e-3, (ParamSpec("b.w", 250_000),))))
>>> from gradsched.core import MeasuredLink
>>> link = MeasuredLink(alone_s=1e-4, pipelined_s=2e-5, seconds_per_byte=1e-9)
>>> round(predict(table, link_cluster(link, workers=2), policy_config("fifo")) * 1e3, 3)
8.1
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from ..core.base import PolicyConfig
from ..core.estimator import MeasuredLink
from ..models.table import Layer, ModelTable
from .cluster import Cluster, LinkBursts
from .simulator import simulate

#: a link slower in bursts: each prediction covers at least this many of its periods ...
BURST_PERIODS = 8
#: ... from each of this many phases of the bursts, evenly spread over a period, and is their mean
BURST_PHASES = 4
#: ... in no more simulated iterations than this (bursts far longer than an iteration)
BURST_ITERATIONS = 400


def link_cluster(link: MeasuredLink, workers: int, servers: int = 0, sharded: bool = False) -> Cluster:
    """The simulator's cluster with a measured link (parameter servers when ``servers`` > 0;
    ``sharded``: architecture="sharded" over the same link)."""
    return ring_cluster(workers, link.seconds_per_byte, link.latency_s, link.overhead_s, servers,
                        link.cast_s_per_byte, sharded)


def ring_cluster(workers: int, seconds_per_byte: float, latency_s: float, overhead_s: float,
                 servers: int = 0, cast_s_per_byte: float = 0.0, sharded: bool = False) -> Cluster:
    """A cluster whose links give a ring all-reduce among ``workers`` the measured cost per
    payload byte (each link carries 2(n-1)/n of the payload), and compression's measured
    cast cost per wire byte."""
    if not seconds_per_byte > 0:
        raise ValueError(f"seconds per byte must be > 0, got {seconds_per_byte!r}")
    n = workers
    bandwidth = 8.0 * 2 * (n - 1) / n / seconds_per_byte if n > 1 else 8.0 / seconds_per_byte
    return Cluster(workers, bandwidth_bps=bandwidth, latency_s=latency_s, overhead_s=overhead_s,
                   arch="ps" if servers else "sharded" if sharded else "allreduce", servers=servers,
                   cast_s_per_byte=cast_s_per_byte)


def scaled(table: ModelTable, compute_s: float) -> ModelTable:
    """``table`` with every layer's times scaled so that its compute time is ``compute_s``."""
    scale = compute_s / table.compute_s if table.compute_s > 0 else 1.0
    layers = tuple(Layer(l.name, l.forward_s * scale, l.backward_s * scale, l.params) for l in table.layers)
    return ModelTable(table.name, layers, table.meta)


def straggling(table: ModelTable, factor: float) -> ModelTable:
    """What a cluster whose slowest worker computes ``factor`` times slower than ``table`` runs:
    its layers' times. A collective completes once its last rank contributes, so every
    gradient is ready, for the link, when the slow worker has it: the others wait (a steady
    straggler; plans made on its ready times, as the runtime makes them once it names it).

    >>> from gradsched.models import ParamSpec
    >>> table = ModelTable("m", (Layer("a", 1.0, 2.0, (ParamSpec("a.weight", 10),)),), {})
    >>> slow = straggling(table, 1.5)
    >>> slow.compute_s, slow.name
    (4.5, 'm (one worker 1.5x slower)')
    """
    slow = scaled(table, table.compute_s * factor)
    return ModelTable(f"{table.name} (one worker {factor:g}x slower)", slow.layers, table.meta)


def slow_link(table: ModelTable, cluster: Cluster, factor: float) -> tuple[ModelTable, Cluster]:
    """What a cluster runs where one worker's link is ``factor`` times slower: a ring (all-reduce,
    reduce-scatter, all-gather) moves every step at its slowest link's pace, so the cluster runs
    as if every link were that slow; the table renamed to say so. Parameter servers are not
    modelled so (the slow worker's link would delay only its own pushes and pulls).

    >>> from gradsched.models import ParamSpec
    >>> table = ModelTable("m", (Layer("a", 1.0, 2.0, (ParamSpec("a.weight", 10),)),), {})
    >>> slow_table, slow = slow_link(table, Cluster(4, 10e9), 2.0)
    >>> slow.bandwidth_bps / 1e9, slow_table.name
    (5.0, "m (one worker's link 2x slower)")
    """
    if cluster.kind.servers:
        raise ValueError("a slower link is modelled for rings (all-reduce, sharded), not for parameter servers")
    named = ModelTable(f"{table.name} (one worker's link {factor:g}x slower)", table.layers, table.meta)
    return named, replace(cluster, bandwidth_bps=cluster.bandwidth_bps / factor)


def link_bursts(table: ModelTable, cluster: Cluster, factor: float, slow_s: float,
                period_s: float) -> tuple[ModelTable, Cluster]:
    """What a cluster runs where one worker's link is ``factor`` times slower for ``slow_s`` of
    every ``period_s`` seconds by the clock: a ring moves at its slowest link's pace, so every
    link has the bursts (:class:`~gradsched.sim.cluster.LinkBursts`); the table renamed to say so.

    >>> from gradsched.models import ParamSpec
    >>> table = ModelTable("m", (Layer("a", 1.0, 2.0, (ParamSpec("a.weight", 10),)),), {})
    >>> named, bursty = link_bursts(table, Cluster(4, 10e9), 2.0, 0.2, 0.4)
    >>> named.name, bursty.mean_factor
    ("m (one worker's link 2x slower for 200 ms of every 400 ms)", 1.3333333333333333)
    """
    if cluster.kind.servers:
        raise ValueError("a link slower in bursts is modelled for rings (all-reduce, sharded), not parameter servers")
    bursts = LinkBursts(factor, slow_s, period_s)
    named = ModelTable(f"{table.name} (one worker's link {bursts.describe()})", table.layers, table.meta)
    return named, replace(cluster, bursts=bursts)


def averaging(cluster: Cluster, bursts: LinkBursts) -> Cluster:
    """``cluster`` (a link as measured over the clock, its rate the average) as the fast link slowed
    in ``bursts``: the same rate on average.

    >>> bursty = averaging(Cluster(2, 3e9), LinkBursts(2.0, 0.2, 0.4))
    >>> bursty.bandwidth_bps / 1e9, bursty.comm_time(1e6) == Cluster(2, 3e9).comm_time(1e6)
    (4.0, True)
    """
    return replace(cluster, bandwidth_bps=cluster.bandwidth_bps / bursts.rate_share, bursts=bursts)


def predict(table: ModelTable, cluster: Cluster, policy: PolicyConfig, iterations: int = 6) -> float:
    """Steady-state seconds per iteration of ``policy``: ``iterations`` simulated after the
    policy's own warm-up (Prophet's profiling). The sharded architectures run under the
    runtime's default budgets: gradients (:func:`~gradsched.core.engine.default_hold`) and, fully
    sharded, whole parameters (:func:`~gradsched.core.gathers.default_budget`).

    On a link slower in bursts (``cluster.bursts``) one run's mean depends on where the bursts
    fall: the mean over :data:`BURST_PHASES` phases of them, each run long enough to cover
    :data:`BURST_PERIODS` periods (as the bench measures such a link: its mean over 8+)."""
    warmup = policy.build().warmup_iterations  # simulate() derives the sizes from the cluster
    bursts = cluster.bursts
    if bursts is None:
        return simulate(table, cluster, policy, iterations=warmup + iterations, record=False).iteration_s
    shortest = max(table.compute_s, cluster.comm_time(table.gradient_bytes))  # no iteration is shorter
    covering = math.ceil(BURST_PERIODS * bursts.period_s / shortest) + 1 if shortest > 0 else iterations
    rounds = warmup + min(BURST_ITERATIONS, max(iterations, covering))
    return statistics.fmean(
        simulate(table, replace(cluster, bursts=replace(bursts, offset_s=bursts.period_s * phase / BURST_PHASES)),
                 policy, iterations=rounds, record=False).iteration_s
        for phase in range(BURST_PHASES))
