"""PNG plots of simulated and measured runs (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .extras import require

require("matplotlib", "plot").use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

from .sim.compare import Row  # noqa: E402
from .sim.simulator import SimResult  # noqa: E402
from .trace import pack_lanes  # noqa: E402

_PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452"}


def plot_timelines(results: Sequence[SimResult], path: str | Path, iterations: int = 2) -> None:
    """The last ``iterations`` steady-state iterations of each result: compute on one row,
    each link direction on its own row, every message a bar (needs recorded results)."""
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 1.6 + 1.3 * len(results)), squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        starts = result.iteration_starts
        lo, hi = starts[max(result.warmup, len(starts) - 1 - iterations)], starts[-1]
        rows = ["compute"] + sorted({seg.lane for rec in result.messages for seg in rec.segments})
        for phase, colour in _PHASE_COLOURS.items():
            bars = [(r.start - lo, r.end - r.start) for r in result.compute
                    if r.phase == phase and r.end > lo and r.start < hi]
            ax.broken_barh([(s * 1e3, d * 1e3) for s, d in bars], (0.6, 0.8), facecolors=colour, label=phase)
        for row, lane in enumerate(rows[1:], start=1):
            bars = [(seg.start - lo, seg.end - seg.start) for rec in result.messages for seg in rec.segments
                    if seg.lane == lane and seg.end > lo and seg.start < hi]
            ax.broken_barh([(s * 1e3, d * 1e3) for s, d in bars], (row + 0.6, 0.8), facecolors="#55A868",
                           edgecolor="white", linewidth=0.3)
        ax.set_yticks([i + 1 for i in range(len(rows))], rows)
        ax.set_xlim(0, (hi - lo) * 1e3)
        ax.set_title(f"{result.policy}: {result.iteration_s * 1e3:.1f} ms/iteration, "
                     f"{result.ratio_to_bound:.2f}x the bound", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (ms)")
    axes[0, 0].legend(loc="upper right", fontsize=7)
    first = results[0]
    fig.suptitle(f"{first.model} · {first.cluster.describe()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows: Sequence[Row], path: str | Path, title: str) -> None:
    """Speed-up over fifo and ratio to the bound against bandwidth, one line per policy."""
    policies = list(dict.fromkeys(row.policy for row in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy in policies:
        mine = sorted((r for r in rows if r.policy == policy), key=lambda r: r.bandwidth_gbps)
        x = [r.bandwidth_gbps for r in mine]
        left.plot(x, [r.speedup_vs_fifo for r in mine], marker="o", label=policy)
        right.plot(x, [r.result.ratio_to_bound for r in mine], marker="o", label=policy)
    for ax, label in ((left, "speed-up over fifo (x)"), (right, "iteration time / bound")):
        _bandwidth_axis(ax, sorted({r.bandwidth_gbps for r in rows}))
        ax.set_xlabel("link bandwidth (Gbit/s)")
        ax.set_ylabel(label)
    right.axhline(1.0, color="black", linewidth=0.8)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bench(data: dict, path: str | Path) -> None:
    """Measured speed-up over DDP and ratio to the bound against bandwidth (one line per
    policy), or bars for a single bandwidth; from ``gradsched bench --json`` data."""
    rows = data["results"]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    with_memory = any(r.get("peak_memory_bytes") for r in rows)
    fig, axes = plt.subplots(1, 3 if with_memory else 2, figsize=(16 if with_memory else 11, 4))
    left, right = axes[0], axes[1]
    if with_memory:
        _time_against_memory(axes[2], rows)
    bandwidths = sorted({r["bandwidth_gbps"] or 0.0 for r in rows})
    for policy in policies:
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["bandwidth_gbps"] or 0.0)
        x = [r["bandwidth_gbps"] or 0.0 for r in mine]
        if len(bandwidths) > 1:
            left.plot(x, [r["speedup_vs_ddp"] or float("nan") for r in mine], marker="o", label=policy)
            right.plot(x, [r["ratio_to_bound"] for r in mine], marker="o", label=policy)
    if len(bandwidths) == 1:
        left.bar(policies, [next(r["speedup_vs_ddp"] or float("nan") for r in rows if r["policy"] == p)
                            for p in policies])
        right.bar(policies, [next(r["ratio_to_bound"] for r in rows if r["policy"] == p) for p in policies])
        for ax in (left, right):
            ax.tick_params(axis="x", rotation=30)
    else:
        for ax in (left, right):
            _bandwidth_axis(ax, bandwidths)
            ax.set_xlabel("link bandwidth (Gbit/s)")
        left.legend(fontsize=8)
    left.set_ylabel("speed-up over DDP (x)")
    right.set_ylabel("iteration time / bound")
    left.axhline(1.0, color="black", linewidth=0.8)
    right.axhline(1.0, color="black", linewidth=0.8)
    kind = "replay" if data.get("replay") else "real"
    where = "emulated network" if data.get("emulated_network") else "loopback, no limit"
    dilated = f" · time dilation K={data['dilation']:g}, times / K" if data.get("dilation", 1) != 1 else ""
    fig.suptitle(f"{data['model']} ({kind}) · {data['workers']} workers · {where}{dilated} (measured)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _time_against_memory(ax, rows: Sequence[dict]) -> None:
    """Each run's iteration time against its peak memory per rank: the most bytes allocated at
    once where measured (the allocator's count; on CUDA its peak), else the resident set's
    high-water mark added by the run (which counts the pages an allocator keeps): lower left
    is better."""
    allocated = all(r.get("peak_allocated_bytes") for r in rows if r.get("peak_memory_bytes"))
    key = "peak_allocated_bytes" if allocated else "peak_memory_bytes"
    for r in rows:
        if not r.get(key):
            continue
        label = r["policy"] + ("" if r.get("bandwidth_gbps") is None else f" @{r['bandwidth_gbps']:.3g}")
        x, y = r[key] / (1 << 20), r["iteration_s"] * 1e3
        ax.scatter([x], [y], s=18)
        ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(f"peak {'allocated' if allocated else 'resident'} memory per rank (MiB)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("time against memory", fontsize=9)


_TRACE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "message": "#55A868", "wait": "#C44E52"}


def trace_iteration(path: str | Path, back: int = 2) -> tuple[float, float, list[dict]]:
    """(start, end, events) of one steady iteration of a run trace (a rank's Chrome trace,
    gradsched's or the bench's DDP trace): from the start of the ``back``-th last forward
    pass to the next. Times in seconds; events are the trace's complete events that
    overlap it, messages of the round before included."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    forward = [e for e in events if e.get("cat") == "forward"]
    if not forward:
        raise ValueError(f"{path}: no forward passes in this trace")
    first = min(forward, key=lambda e: e["ts"])["name"]  # the module that starts every forward pass
    starts = sorted(e["ts"] for e in forward if e["name"] == first)
    if len(starts) < back + 1:
        raise ValueError(f"{path}: {len(starts)} iterations traced, at least {back + 1} needed")
    lo, hi = starts[-back - 1], starts[-back]
    inside = [e for e in events if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    return lo / 1e6, hi / 1e6, inside


def plot_iteration_timelines(runs: Sequence[tuple[str, str | Path]], path: str | Path, title: str,
                             dilation: float = 1.0) -> None:
    """One steady iteration of each run (label, rank 0's trace) on a shared time axis:
    compute (forward, backward), each message from launch to result (messages in flight
    together on rows of their own), and the forward pass's waits for updates. Times are
    divided by ``dilation`` (the bench's time dilation)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 1.2 + 1.9 * len(runs)), squeeze=False, sharex=True)
    longest = 0.0
    for ax, (label, trace) in zip(axes[:, 0], runs):
        lo, hi, events = trace_iteration(trace)
        longest = max(longest, (hi - lo) / dilation)

        def bars(selected):
            return [((e["ts"] / 1e6 - lo) / dilation * 1e3, e["dur"] / 1e6 / dilation * 1e3) for e in selected]

        compute = [e for e in events if e.get("cat") in ("forward", "backward")]
        for phase in ("forward", "backward"):
            ax.broken_barh(bars([e for e in compute if e["cat"] == phase]), (0.6, 0.8),
                           facecolors=_TRACE_COLOURS[phase], label=phase)
        messages = sorted((e for e in events if e.get("cat") == "message"), key=lambda e: e["ts"])
        lanes = pack_lanes((e["ts"], e["ts"] + e["dur"]) for e in messages)
        depth = max(lanes, default=-1) + 1
        for lane in range(depth):
            mine = [e for e, l in zip(messages, lanes) if l == lane]
            ax.broken_barh(bars(mine), (1.6 + 0.8 * lane / max(depth, 1), 0.8 / max(depth, 1) * 0.9),
                           facecolors=_TRACE_COLOURS["message"], edgecolor="white", linewidth=0.3,
                           label="message (launch to result)" if lane == 0 else None)
        ax.broken_barh(bars([e for e in events if e.get("cat") == "wait"]), (2.6, 0.8),
                       facecolors=_TRACE_COLOURS["wait"], label="forward waits")
        ax.set_yticks([1, 2, 3], ["compute", "messages", "waits"])
        ax.set_title(f"{label}: {(hi - lo) / dilation * 1e3:.0f} ms this iteration", fontsize=9, loc="left")
    axes[0, 0].set_xlim(0, longest * 1e3 * 1.02)
    axes[-1, 0].set_xlabel("time from the iteration's first forward (ms)")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=5)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bandwidth_axis(ax, bandwidths) -> None:
    """Log scale, ticks at the measured bandwidths, written as plain numbers."""
    ax.set_xscale("log")
    ax.set_xticks(bandwidths)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
