"""Calibration runs before the measured ones: the time dilation K under ``--dilation auto``, and
the bandwidth at which compute and communication balance under ``--balance``."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .config import BenchConfig
from .dilation import AUTO_RAISES, auto_dilation, raised_dilation
from .figures import figures
from .launch import measure
from .protocol import COMM_ONLY

CALIBRATION_ITERS = 8


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
    raw = measure(undilated, fastest, lambda message: None, runs=(), iters=CALIBRATION_ITERS)
    busy = raw.host_cpu.get(COMM_ONLY)
    k, history = auto_dilation(busy), []
    for _ in range(AUTO_RAISES):
        if progress:
            progress(f"dilation: calibrating{where} at K={k}, the runs themselves")
        trying = dataclasses.replace(config, dilation=float(k))
        raw = measure(trying, fastest, lambda message: None, iters=CALIBRATION_ITERS)
        shares = [raw.host_cpu.get(run.name) for run in config.runs]
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
        raw = measure(config, bandwidth, lambda message: None, runs=(), iters=CALIBRATION_ITERS)
        setting = figures(config, bandwidth, True, raw)
        history.append({"bandwidth_gbps": bandwidth / 1e9, "compute_s": setting.compute_s, "comm_s": setting.comm_s})
        ratio = setting.comm_s / setting.compute_s
        bandwidth *= ratio
        if abs(ratio - 1.0) < BALANCED_WITHIN:
            break
    return bandwidth, history
