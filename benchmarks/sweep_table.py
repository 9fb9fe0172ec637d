"""The simulator's figures of docs/simulator.md: every policy over a bandwidth sweep, as Markdown tables.

    python benchmarks/sweep_table.py [--models vgg16,resnet50] [--workers 16] [--archs allreduce,ps] [--json FILE]
    python benchmarks/sweep_table.py --table FILE     # the tables again, from the JSON

Each cell is "speed-up over fifo / iteration time over the bound" from one simulation (V100
preset, batch 32, 50 us latency, default policy options). ``--json`` writes the figures the
tables are printed from (docs/figures/sim-sweep.json); the docs test checks the page against it.
"""

from __future__ import annotations

import argparse
import json

from gradsched.core import POLICIES
from gradsched.models import model_table
from gradsched.sim import Cluster
from gradsched.sim.compare import compare


def sweep(models: list[str], archs: list[str], workers: int, bandwidths: list[float], iterations: int = 30) -> dict:
    """Every policy at every setting: one entry per model and architecture."""
    sweeps = []
    for name in models:
        table = model_table(name)
        for arch in archs:
            clusters = [Cluster(workers, b * 1e9, arch=arch) for b in bandwidths]
            rows = compare(table, clusters, list(POLICIES), iterations)
            settings = []
            for gbps, cluster in zip(bandwidths, clusters):
                mine = {r.policy: r for r in rows if r.result.cluster is cluster}
                settings.append({"bandwidth_gbps": gbps, "bound_s": mine["fifo"].result.bound_s,
                                 "policies": {p: {"iteration_s": mine[p].result.iteration_s,
                                                  "ratio_to_bound": mine[p].result.ratio_to_bound,
                                                  "speedup_vs_fifo": mine[p].speedup_vs_fifo} for p in POLICIES}})
            sweeps.append({"model": name, "arch": arch, "workers": workers, "compute_s": table.compute_s,
                           "settings": settings})
    return {"iterations": iterations, "sweeps": sweeps}


def tables(data: dict) -> str:
    out = []
    for entry in data["sweeps"]:
        policies = list(entry["settings"][0]["policies"])
        out += [f"**{entry['model']}, {entry['workers']} workers, {entry['arch']}** "
                f"(compute {entry['compute_s'] * 1e3:.0f} ms)", "",
                "| Gbit/s | bound ms | " + " | ".join(policies) + " |", "|---:|---:|" + "---:|" * len(policies)]
        for s in entry["settings"]:
            cells = [f"{c['speedup_vs_fifo']:.2f}x / {c['ratio_to_bound']:.2f}" for c in s["policies"].values()]
            out.append(f"| {s['bandwidth_gbps']:g} | {s['bound_s'] * 1e3:.0f} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg16,resnet50")
    parser.add_argument("--archs", default="allreduce,ps")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--bandwidths", default="1,2,5,10,25,50,100", help="Gbit/s")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--table", metavar="FILE", help="print the tables of a JSON written by --json")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(tables(json.load(f)), end="")
        return
    data = sweep(args.models.split(","), args.archs.split(","), args.workers,
                 [float(b) for b in args.bandwidths.split(",")], args.iterations)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(tables(data), end="")


if __name__ == "__main__":
    main()
