"""Where scheduling the sharded traffic wins or loses, in the simulator: gradsched's sharded
architecture under ``prophet`` against FSDP2-style prefetch of one layer ahead
(gradsched.sim.fsdp, with and without resharding after the forward pass) and against
all-reduce under ``prophet``, at 64 and 256 workers.

    python benchmarks/sharded_table.py --json docs/figures/sharded-sim.json   # run and save
    python benchmarks/sharded_table.py --table docs/figures/sharded-sim.json  # the table of docs/simulator.md

Each cell: iteration ms / ratio to the bound max(compute, communication of an all-reduce's
bytes). V100 profiles, batch 32, 50 us latency.
"""

from __future__ import annotations

import argparse
import json

from gradsched.models import model_table
from gradsched.sim import Cluster, simulate
from gradsched.sim.fsdp import fsdp_iteration_s

MODELS = ("resnet50", "vgg16", "bert-large")
WORKERS = (64, 256)
BANDWIDTHS_GBPS = (10, 25, 100)
RUNS = ("allreduce prophet", "sharded prophet", "fsdp2 keep", "fsdp2")


def measure() -> dict:
    rows = []
    for name in MODELS:
        table = model_table(name)
        for workers in WORKERS:
            for gbps in BANDWIDTHS_GBPS:
                shard = Cluster(workers=workers, bandwidth_bps=gbps * 1e9, latency_s=50e-6, arch="sharded")
                ring = Cluster(workers=workers, bandwidth_bps=gbps * 1e9, latency_s=50e-6)
                bound = max(table.compute_s, ring.comm_time(table.gradient_bytes))
                times = {"allreduce prophet": simulate(table, ring, "prophet", iterations=12, record=False).iteration_s,
                         "sharded prophet": simulate(table, shard, "prophet", iterations=12, record=False).iteration_s,
                         "fsdp2 keep": fsdp_iteration_s(table, shard, reshard_after_forward=False),
                         "fsdp2": fsdp_iteration_s(table, shard, reshard_after_forward=True)}
                rows.append({"model": name, "workers": workers, "bandwidth_gbps": gbps, "compute_s": table.compute_s,
                             "bound_s": bound, "iteration_s": times})
    return {"runs": list(RUNS), "rows": rows}


def table(data: dict) -> str:
    runs = data["runs"]
    lines = ["| model | workers | Gbit/s | compute ms | bound ms | " + " | ".join(runs) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(runs)]
    for row in data["rows"]:
        cells = [f"{row['iteration_s'][r] * 1e3:.0f} / {row['iteration_s'][r] / row['bound_s']:.2f}" for r in runs]
        lines.append(f"| {row['model']} | {row['workers']} | {row['bandwidth_gbps']:g} | {row['compute_s'] * 1e3:.0f} | "
                     f"{row['bound_s'] * 1e3:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="run, and write the figures here")
    parser.add_argument("--table", help="print the table of a saved run")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)), end="")
        return
    data = measure()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(table(data), end="")


if __name__ == "__main__":
    main()
