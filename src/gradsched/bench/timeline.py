"""``gradsched bench --timeline``: one iteration of the reference and of the fastest policy
on a shared time axis, drawn from the runs' own traces (rank 0's)."""

from __future__ import annotations

import os

from .config import BASELINES


def timeline_runs(data: dict) -> list[str]:
    """The runs to draw, from ``gradsched bench --json`` data: the reference (``ddp``, or
    ``fifo`` where there is no DDP run, as with parameter servers) and the fastest other
    policy, at the last bandwidth measured (the one whose traces the folder holds)."""
    rows = data["results"]
    if not rows:
        return []
    last = rows[-1]["bandwidth_gbps"]
    here = [r for r in rows if r["bandwidth_gbps"] == last]
    names = [r["policy"] for r in here]
    reference = next((p for p in ("ddp", "fifo") if p in names), None)
    others = [r for r in here if r["policy"] not in BASELINES and r["policy"] != reference and "+" not in r["policy"]]
    best = min(others, key=lambda r: r["iteration_s"])["policy"] if others else None
    return [p for p in (reference, best) if p is not None]


def draw_timeline(data: dict, trace_dir: str, path: str) -> list[str]:
    """Write the picture to ``path``; returns the runs drawn."""
    from ..plot import plot_iteration_timelines

    runs = timeline_runs(data)
    traces = [(p, os.path.join(trace_dir, f"{p}.rank0.json")) for p in runs]
    missing = [t for _, t in traces if not os.path.exists(t)]
    if len(runs) < 2 or missing:
        raise ValueError(f"--timeline needs traces of a reference (ddp or fifo) and a policy; missing: {missing or runs}")
    setting = data["settings"][-1]
    gbps = setting.get("bandwidth_gbps")
    where = f"{gbps:.3g} Gbit/s" if gbps else "loopback"
    dilation = float(data.get("dilation") or 1.0)
    title = (f"{data['model']} · {data['workers']} workers · {where}"
             + (f" · time dilation K={dilation:g}, times / K" if dilation != 1 else "") + " (measured traces, rank 0)")
    plot_iteration_timelines([(p, t) for p, t in traces], path, title, dilation)
    return runs
