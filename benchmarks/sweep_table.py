"""The README's figures: every policy over a bandwidth sweep, as Markdown tables.

    python benchmarks/sweep_table.py [--models vgg16,resnet50] [--workers 16] [--archs allreduce,ps]

Each cell is "speed-up over fifo / iteration time over the bound" from one simulation.
"""

from __future__ import annotations

import argparse

from gradsched.core import POLICIES
from gradsched.models import model_table
from gradsched.sim import Cluster
from gradsched.sim.compare import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg16,resnet50")
    parser.add_argument("--archs", default="allreduce,ps")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--bandwidths", default="1,2,5,10,25,50,100", help="Gbit/s")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    bandwidths = [float(b) for b in args.bandwidths.split(",")]
    for name in args.models.split(","):
        table = model_table(name)
        for arch in args.archs.split(","):
            clusters = [Cluster(args.workers, b * 1e9, arch=arch) for b in bandwidths]
            rows = compare(table, clusters, list(POLICIES), args.iterations)
            print(f"\n**{name}, {args.workers} workers, {arch}** (compute {table.compute_s * 1e3:.0f} ms)\n")
            print("| Gbit/s | bound ms | " + " | ".join(POLICIES) + " |")
            print("|---:|---:|" + "---:|" * len(POLICIES))
            for cluster in clusters:
                mine = {r.policy: r for r in rows if r.result.cluster is cluster}
                cells = [f"{mine[p].speedup_vs_fifo:.2f}x / {mine[p].result.ratio_to_bound:.2f}" for p in POLICIES]
                bound = mine["fifo"].result.bound_s * 1e3
                print(f"| {cluster.bandwidth_bps / 1e9:g} | {bound:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
