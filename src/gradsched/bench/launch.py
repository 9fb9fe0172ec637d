"""Launching the benchmark's ranks: what every rank is told (the payload), starting them on the
emulated cluster (or loopback) the way torchrun would, a watchdog, and rank 0's result read back,
its times undilated."""

from __future__ import annotations

import os
import threading
from typing import Callable, Sequence

from .config import BASELINES, BenchConfig
from .link_bursts import LinkSwitch
from .netns import EmulatedCluster
from .processes import Processes, free_port, read_result, starts
from .protocol import Run, WorkerConfig
from .results import RankReport


def payload(config: BenchConfig, runs: Sequence[Run] | None, iters: int | None) -> str:
    """What every rank is told to run (the worker's one argument)."""
    return WorkerConfig(
        model=config.model, batch=config.batch, device=config.device, iters=iters or config.iters,
        warmup=config.warmup, runs=tuple(config.runs if runs is None else runs),
        profile_rounds=config.profile_rounds, fallback=config.fallback,
        options={p: config.policy_options(p) for p in config.policies if p not in BASELINES},
        arch=config.arch, servers=config.servers, compression=config.compression,
        dilation=float(config.dilation), trace_dir=config.trace_dir, straggler=config.straggler,
        plan_on_slow_rank=config.plan_on_slow_rank).to_json()


def timed_out(config: BenchConfig, finished: Sequence[tuple[str, float]]) -> str:
    """Why a launch failed on its timeout, with the runs that had finished by then and their
    median iterations (undilated: the dilated times over K), which no table will show.

    >>> config = BenchConfig(model="replay-mini", timeout_s=60.0, dilation=3.0)
    >>> timed_out(config, [("ddp", 0.9), ("prophet", 0.75)])
    'the benchmark ranks did not finish within 60 s (--timeout); finished before it (median iteration, undilated): ddp 300.0 ms, prophet 250.0 ms'
    >>> timed_out(config, [])
    'the benchmark ranks did not finish within 60 s (--timeout); no run had finished'
    """
    k = config.dilation if isinstance(config.dilation, (int, float)) else 1.0
    said = ", ".join(f"{name} {seconds / k * 1e3:.1f} ms" for name, seconds in finished)
    return (f"the benchmark ranks did not finish within {config.timeout_s:.0f} s (--timeout); "
            + (f"finished before it (median iteration, undilated): {said}" if said else "no run had finished"))


def launch(config: BenchConfig, cluster: EmulatedCluster | None, progress: Callable[[dict], None],
           runs: Sequence[Run] | None = None, iters: int | None = None) -> RankReport:
    """Run the ranks once: ``runs`` (default: every run of the config), then the baselines."""
    port = free_port() if cluster is None else 29500 + os.getpid() % 1000
    master = "127.0.0.1" if cluster is None else cluster.addresses[0]
    processes = Processes(cluster, config.launcher == "torchrun")
    watchdog = threading.Timer(config.timeout_s, processes.kill_all)
    watchdog.daemon = True
    reading, writing = os.pipe()  # rank 0's stdout: progress and the result
    finished: list[tuple[str, float]] = []  # (run, its median iteration, dilated) as each run ends

    def heard(message: dict) -> None:
        if message["kind"] == "finished":
            finished.append((message["policy"], message["median_s"]))
        else:
            progress(message)

    try:
        worker = ["-m", "gradsched.bench.worker", payload(config, runs, iters)]
        for start in starts(config.launcher == "torchrun", config.hosts, config.procs_per_node, cluster, worker, master,
                            port, writing):
            processes.start(*start)
        os.close(writing)
        writing = None
        watchdog.start()
        result = read_result(reading, heard)
        for proc in processes.procs:
            proc.wait()
        if processes.expired.is_set():
            raise TimeoutError(timed_out(config, finished))
        failure = processes.failure(result)
        if failure is not None:
            raise RuntimeError(failure)
        return RankReport.from_json(result)
    finally:
        watchdog.cancel()
        processes.close()
        os.close(reading)
        if writing is not None:
            os.close(writing)


def measure(config: BenchConfig, bandwidth: float | None, progress: Callable[[dict], None], emulated: bool = True,
            runs: Sequence[Run] | None = None, iters: int | None = None) -> RankReport:
    """One run of the ranks at ``bandwidth`` (on loopback unless ``emulated``), dilated by the
    config's K (links 1/K as fast, latency K times as long) and its times divided by K."""
    k = float(config.dilation)
    if not emulated:
        return launch(config, None, progress, runs, iters).undilated(k)
    rate = None if bandwidth is None else bandwidth / k
    straggler = config.straggler
    steady = straggler is not None and straggler.link and straggler.steady
    host = None if straggler is None else straggler.host(config.procs_per_node)  # the link slowed: its host's
    slower = {host: straggler.factor} if steady else None
    with EmulatedCluster(config.hosts, rate, config.latency_s * k, mtu=config.mtu, slower=slower) as cluster:
        if straggler is None or not straggler.link_bursts:
            return launch(config, cluster, progress, runs, iters).undilated(k)
        with LinkSwitch(cluster, straggler, k, host) as switch:  # by the clock, from before the ranks start
            report = launch(config, cluster, progress, runs, iters)
        if switch.errors:
            raise RuntimeError(f"the straggler's link could not be switched: {switch.errors[0]}")
        return report.undilated(k)
