"""Runs the benchmark: an emulated cluster per bandwidth, the ranks, the figures.

For each bandwidth the runner builds the emulated cluster (or, where that is impossible,
uses loopback and says so), starts one worker per rank the way torchrun would (or, for
hosts of several ranks, one real torchrun per host, as users launch across hosts), shows
progress, and turns rank 0's timings into figures (:mod:`~gradsched.bench.figures`): the
median iteration time of each run, the measured compute-only and communication-only times,
the bound max(compute, communication), the ratio to it, the speed-up over DDP, and, for
replay models, the simulator's prediction for the same setting on the measured link. What
to measure is :mod:`~gradsched.bench.config`; launching, :mod:`~gradsched.bench.launch`;
calibrations, :mod:`~gradsched.bench.calibration`; the report, :mod:`~gradsched.bench.report`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .calibration import choose_dilation, find_balance
from .config import BenchConfig
from .figures import Setting, figures
from .launch import measure
from .netns import available


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None,
              warn: Callable[[str], None] | None = None) -> list[Setting]:
    """Every bandwidth of ``config`` measured (after the calibrations it asks for): the figures of each."""
    ok, why = (False, "loopback was asked for") if config.loopback else available()
    if config.balance and not ok:
        raise RuntimeError(f"--balance needs the emulated network ({why})")
    if config.straggler is not None and config.straggler.link and not ok:
        raise RuntimeError(f"--straggler ...:link slows a link of the emulated network, which is unavailable ({why})")
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

        raw = measure(config, bandwidth if ok else None, show, emulated=ok)
        settings.append(figures(config, bandwidth if ok else None, ok and bandwidth is not None, raw))
        settings[-1].calibration = calibration
        settings[-1].dilation, settings[-1].dilation_busy = float(config.dilation), busy
        settings[-1].dilation_history = dilation_history
    return settings
