"""The loopback overhead benchmark's paired summary (benchmarks/runtime_overhead.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("runtime_overhead", ROOT / "benchmarks" / "runtime_overhead.py")
overhead = importlib.util.module_from_spec(spec)
spec.loader.exec_module(overhead)


def test_ratios_are_paired_by_round_so_drift_cancels():
    # DDP and fifo both slow down 3x over the rounds; fifo is always 10% slower in its own round
    ddp = [0.010, 0.020, 0.030, 0.030, 0.020]
    runs = [{"rounds": {"ddp": ddp, "fifo": [t * 1.1 for t in ddp]}, "stats": {}},
            {"rounds": {"ddp": [0.010, 0.010], "fifo": [0.012, 0.008]}, "stats": {}}]
    summary = overhead.summary(runs)
    fifo = summary["fifo"]
    assert fifo["rounds"] == 7
    assert fifo["ratio_to_ddp"] == pytest.approx(1.1)  # ratios 1.1 x5, 1.2, 0.8: the median
    assert fifo["ratio_q1"] == pytest.approx(1.1) and fifo["ratio_q3"] == pytest.approx(1.1)
    assert fifo["iteration_s"] == pytest.approx(0.022)  # median of all fifo rounds
    assert summary["ddp"]["ratio_to_ddp"] == 1.0
    text = overhead.table({"args": {"ranks": 2, "batch": 32, "width": 1024, "depth": 6, "repeats": 2, "iters": 10},
                           "summary": summary, "runs": runs})
    assert "fifo" in text and "1.100x" in text and "(1.100-1.100)" in text
