"""The offline tuner against an exhaustive grid over the same search space.

    python benchmarks/tune_vs_grid.py [--policy bytescheduler] [--trials 15] [--grid 8] [--seeds 0,1,2]

For each setting (model, bandwidth, architecture, latency; 16 workers, V100 preset,
batch 32) it prints the default options' iteration time, the best of a log-spaced grid of GRID x GRID
points, and for each seed the tuner's best after TRIALS simulations (the default first)
as a ratio to the grid's best, and the trial at which it first came within 5% of it.
"""

from __future__ import annotations

import argparse
import time

from gradsched.models import model_table
from gradsched.sim import Cluster
from gradsched.tune import default_space, grid_search, tune_offline

# (model, Gbit/s, architecture, latency): each model at three bandwidths around where compute
# and communication are equal, then settings where the defaults are further from the best
SETTINGS = [("vgg16", g, "allreduce", 50e-6) for g in (10, 25, 50)] + \
    [("resnet50", g, "allreduce", 50e-6) for g in (5, 10, 25)] + \
    [("vgg16", 10, "ps", 50e-6), ("resnet50", 10, "ps", 50e-6),
     ("vgg16", 25, "allreduce", 1e-3), ("resnet50", 10, "allreduce", 1e-3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="bytescheduler")
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--grid", type=int, default=8, help="points per dimension")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    space = default_space(args.policy)
    print(f"{args.policy}, {args.workers} workers; grid {args.grid}^{len(space.dimensions)}, "
          f"{args.trials} trials, seeds {seeds}")
    print(f"{'setting':<30} {'default ms':>10} {'grid ms':>9} {'tuned/grid per seed':>22}  within 5% at trial")
    worst = 0.0
    tables = {}
    for model, gbps, arch, latency in SETTINGS:
        if model not in tables:
            tables[model] = model_table(model)
        table = tables[model]
        cluster = Cluster(args.workers, bandwidth_bps=gbps * 1e9, latency_s=latency, arch=arch)
        name = f"{model} {gbps}G {arch} {latency * 1e6:g}us"
        started = time.perf_counter()
        grid = grid_search(table, cluster, space, args.grid)
        ratios, reached = [], []
        for seed in seeds:
            result = tune_offline(table, cluster, space, args.trials, seed)
            ratios.append(result.best["iteration_s"] / grid["iteration_s"])
            hit = next((h["trial"] for h in result.history if h["best_s"] <= 1.05 * grid["iteration_s"]), None)
            reached.append("-" if hit is None else str(hit))
        worst = max(worst, *ratios)
        print(f"{name:<30} {result.default['iteration_s'] * 1e3:10.1f} "
              f"{grid['iteration_s'] * 1e3:9.1f} {' '.join(f'{r:.3f}' for r in ratios):>22}  "
              f"{', '.join(reached)}   ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"worst tuned/grid: {worst:.3f}")


if __name__ == "__main__":
    main()
