"""Iteration time against the number of workers: bench runs at several worker counts (each at
its own balance point, one JSON each), DDP and every policy measured, beside the simulator's
curve from each run's own measurements (its compute alone and its link), and the simulator's
prediction at worker counts not measured (on the largest run's link, at the balance point
for that count):

    python benchmarks/scaling.py docs/figures/bench-scaling-resnet50-2w.json \
        docs/figures/bench-scaling-resnet50-4w.json docs/figures/bench-scaling-resnet50-8w.json \
        --predict 16 --plot docs/figures/scaling-resnet50.png

A ring all-reduce moves 2(n-1)/n of the gradients per worker, so the balance point of n
workers (compute alone = communication alone) is at 2(n-1)/n times the bandwidth of one
worker pair's; a count only predicted is simulated there. DDP is simulated as its buckets
(25 MiB, in the order the backward pass gives them); a policy as the plan it ran (the
buckets, where it fell back).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from gradsched.bench.figures import measured_setting
from gradsched.core import policy_config
from gradsched.core.policies import FifoConfig, is_buckets
from gradsched.sim.predict import link_cluster, predict

BASELINE = "ddp"


@dataclass
class Point:
    """One worker count: what ran there, and what the simulator says of it."""

    workers: int
    bandwidth_gbps: float
    bound_s: float
    measured_s: dict[str, float] = field(default_factory=dict)  # policy -> iteration (empty: predicted only)
    simulated_s: dict[str, float] = field(default_factory=dict)  # policy -> the simulator's iteration
    dilation: float | None = None
    host_busy: float | None = None  # the busiest run's share of the host's CPUs
    fell_back: set[str] = field(default_factory=set)  # policies whose measured trial chose the buckets


def ring_share(workers: int) -> float:
    """What a ring all-reduce moves per worker, in gradients' worth: 2(n-1)/n."""
    return 2 * (workers - 1) / workers


def _fell_back(policy: str, row: dict | None) -> bool:
    ran = (row or {}).get("plan") or policy
    return is_buckets(ran) and not is_buckets(policy)


def _config(policy: str, row: dict | None):
    if policy == BASELINE or _fell_back(policy, row):
        return FifoConfig.ddp_buckets()
    return policy_config((row or {}).get("plan") or policy)


def points(paths: list[str], batch: int, extra: list[int]) -> list[Point]:
    """The measured worker counts (one bench JSON each) and the ``extra`` ones, predicted only."""
    out = []
    largest = None
    for path in paths:
        run = json.load(open(path))
        try:
            model, link = measured_setting(run, batch)
        except ValueError as exc:
            raise SystemExit(f"{path}: {exc}") from None
        setting = run["settings"][0]
        rows = {r["policy"]: r for r in run["results"] if r["bandwidth_gbps"] == setting["bandwidth_gbps"]}
        point = Point(run["workers"], setting["bandwidth_gbps"], setting["bound_s"],
                      {p: r["iteration_s"] for p, r in rows.items()}, dilation=run.get("dilation"),
                      host_busy=max((r["host_cpu_busy"] for r in rows.values() if r.get("host_cpu_busy") is not None),
                                    default=None))
        point.fell_back = {p for p, r in rows.items() if _fell_back(p, r)}
        cluster = link_cluster(link, run["workers"])
        point.simulated_s = {p: predict(model, cluster, _config(p, r)) for p, r in rows.items()}
        out.append(point)
        if largest is None or point.workers > largest[0].workers:
            largest = (point, model, link, list(rows))
    for workers in extra:
        point, model, link, policies = largest
        # at the balance point of ``workers`` communication alone takes what it took at the largest
        # run's count (the compute's time): the same ring time per gradient byte, on faster links
        cluster = link_cluster(link, workers)
        predicted = Point(workers, point.bandwidth_gbps * ring_share(workers) / ring_share(point.workers),
                          point.bound_s)
        predicted.simulated_s = {p: predict(model, cluster, _config(p, None)) for p in policies}
        out.append(predicted)
    return sorted(out, key=lambda p: p.workers)


def table(pts: list[Point]) -> str:
    policies = list(dict.fromkeys(p for point in pts for p in point.simulated_s))
    lines = ["| workers | Gbit/s | K | host busy | bound ms | " + " | ".join(policies) + " |",
             "|---:|---:|---:|---:|---:|" + "---:|" * len(policies)]
    for point in pts:
        cells = []
        for p in policies:
            sim = point.simulated_s.get(p)
            measured = point.measured_s.get(p)
            if measured is None:
                cells.append(f"({sim * 1e3:.0f})")
                continue
            base = point.measured_s.get(BASELINE)
            gain = f" / {base / measured:.2f}x" if base and p != BASELINE else ""
            mark = "*" if p in point.fell_back else ""
            cells.append(f"{measured * 1e3:.0f} ({sim * 1e3:.0f}) / {measured / point.bound_s:.2f}{gain}{mark}")
        k = "-" if point.dilation is None and not point.measured_s else f"{point.dilation or 1:g}"
        busy = "-" if point.host_busy is None else f"{point.host_busy:.0%}"
        lines.append(f"| {point.workers} | {point.bandwidth_gbps:.3g} | {k} | {busy} | {point.bound_s * 1e3:.0f} | "
                     + " | ".join(cells) + " |")
    if any(point.fell_back for point in pts):
        lines.append("\n\\* the measured trial chose DDP-style buckets over the policy's own plans (simulated as them)")
    return "\n".join(lines) + "\n"


def plot(pts: list[Point], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(p for point in pts for p in point.simulated_s))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, policy in enumerate(policies):
        color = f"C{i}"
        xs = [p.workers for p in pts if policy in p.measured_s]
        ax.plot(xs, [p.measured_s[policy] * 1e3 for p in pts if policy in p.measured_s], "o-", color=color,
                label=f"{policy} measured")
        ax.plot([p.workers for p in pts], [p.simulated_s[policy] * 1e3 for p in pts], "x--", color=color, alpha=0.7,
                label=f"{policy} simulated")
        for p in pts:
            if policy in p.fell_back:  # measured and simulated as the buckets its trial chose
                ax.annotate("buckets*", (p.workers, p.measured_s[policy] * 1e3), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=color)
    ax.plot([p.workers for p in pts], [p.bound_s * 1e3 for p in pts], ":", color="gray", label="bound")
    ax.set_xscale("log", base=2)
    ax.set_xticks([p.workers for p in pts], [str(p.workers) for p in pts])
    ax.set_xlabel("workers (each count at its balance point)")
    ax.set_ylabel("iteration ms")
    ax.set_ylim(bottom=0)
    ax.set_title(title + ("  (* lost its measured trial: ran DDP-style buckets)"
                          if any(p.fell_back for p in pts) else ""), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="bench JSON files (gradsched bench --json), one per worker count")
    parser.add_argument("--batch", type=int, default=96, help="the replay's batch the runs used (default 96)")
    parser.add_argument("--predict", default="", help="comma list of worker counts to predict only, e.g. 16")
    parser.add_argument("--plot", help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    try:
        extra = [int(n) for n in args.predict.split(",") if n]
    except ValueError:
        parser.error(f"--predict must be worker counts such as 16,32, got {args.predict!r}")
    if any(n < 2 for n in extra):
        parser.error("--predict: worker counts must be >= 2")
    pts = points(args.runs, args.batch, extra)
    sys.stdout.write(table(pts))
    if args.plot:
        plot(pts, args.plot, json.load(open(args.runs[0]))["model"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
