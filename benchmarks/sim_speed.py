"""How fast is the simulator? 100 iterations of ResNet-50 under every policy.

    python benchmarks/sim_speed.py [--model resnet50] [--iterations 100] [--arch allreduce]

Prints wall-clock seconds per policy and in total (the table is built first, untimed).
"""

from __future__ import annotations

import argparse
import time

from gradsched.core import POLICIES
from gradsched.models import model_table
from gradsched.sim import Cluster, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--arch", default="allreduce", choices=["allreduce", "ps"])
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    table = model_table(args.model)
    cluster = Cluster(workers=args.workers, bandwidth_bps=10e9, arch=args.arch)
    total = 0.0
    for name in POLICIES:
        t0 = time.perf_counter()
        result = simulate(table, cluster, name, iterations=args.iterations)
        dt = time.perf_counter() - t0
        total += dt
        events = len(result.log)
        print(f"{name:14s} {dt:6.2f} s  {events / dt / 1e3:7.0f}k events/s  iteration {result.iteration_s * 1e3:.1f} ms")
    print(f"{'all policies':14s} {total:6.2f} s for {args.iterations} iterations of {args.model} ({cluster.describe()})")


if __name__ == "__main__":
    main()
