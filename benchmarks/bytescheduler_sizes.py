"""bytescheduler's derived slice and window sizes against ByteScheduler's fixed ones and prophet,
in the simulator, over the settings they were chosen on (``gradsched.core.sizing``).

    python benchmarks/bytescheduler_sizes.py [--json FILE] [--table FILE]

Settings: ResNet-50, VGG-16 and the Transformer (V100 preset), at batch 32 on 16, 8 and 4
workers (10, 25, 5 Gbit/s; latency 50, 20, 100 us; per-message overhead 0, 10, 30 us), and at
batches 64 and 96 on 2 workers at their balance points (communication = compute) with three
measured-like links (latency / overhead 0.10/0.05, 0.28/0.16, 1.0/0.5 ms). Each row: the sizes
derived, and each policy's simulated iteration time over prophet's.
"""

from __future__ import annotations

import argparse
import json
import sys

from gradsched.core import policy_config
from gradsched.models import model_table
from gradsched.progress import Progress
from gradsched.sim import Cluster, predict

MiB = 1 << 20
MODELS = ("resnet50", "vgg16", "transformer")
WIDE = ((16, 10e9, 50e-6, 0.0), (8, 25e9, 20e-6, 10e-6), (4, 5e9, 100e-6, 30e-6))
BALANCE_LINKS = ((100e-6, 50e-6), (280e-6, 160e-6), (1e-3, 500e-6))
ORIGINAL = {"partition_bytes": 4 * MiB, "credit_bytes": 16 * MiB}


def settings() -> list[tuple[str, int, Cluster]]:
    out = []
    for model in MODELS:
        for workers, bandwidth, latency, overhead in WIDE:
            out.append((model, 32, Cluster(workers, bandwidth, latency, "allreduce", 0, overhead)))
        for batch in (64, 96):
            table = model_table(model, batch, "v100")
            per_byte = table.compute_s / table.gradient_bytes  # 2 workers: a ring all-reduce of it takes compute_s
            for latency, overhead in BALANCE_LINKS:
                out.append((model, batch, Cluster(2, 8.0 / per_byte, latency, "allreduce", 0, overhead)))
    return out


def run() -> list[dict]:
    rows = []
    todo = settings()
    with Progress("settings", total=len(todo)) as say:
        for model, batch, cluster in todo:
            say(f"{model} batch {batch}, {cluster.workers} workers")
            rows.append(_row(model, batch, cluster))
    return rows


def _row(model: str, batch: int, cluster: Cluster) -> dict:
    table = model_table(model, batch, "v100")
    derived = policy_config("bytescheduler").for_link(table.gradient_bytes, cluster.latency_s,
                                                      cluster.phase_seconds_per_byte, cluster.overhead_s)
    prophet = predict(table, cluster, policy_config("prophet"))
    return {
        "model": model, "batch": batch, "workers": cluster.workers, "gbps": cluster.bandwidth_bps / 1e9,
        "latency_s": cluster.latency_s, "overhead_s": cluster.overhead_s,
        "partition_bytes": derived.partition_bytes, "credit_bytes": derived.credit_bytes,
        "prophet_s": prophet,
        "derived_s": predict(table, cluster, derived),
        "original_s": predict(table, cluster, policy_config("bytescheduler", **ORIGINAL)),
    }


def table(rows: list[dict]) -> str:
    lines = ["| model | batch | workers | Gbit/s | latency / overhead ms | derived slice / window MiB "
             "| derived / prophet | original / prophet |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['workers']} | {r['gbps']:.2f} "
                     f"| {r['latency_s'] * 1e3:.2f} / {r['overhead_s'] * 1e3:.2f} "
                     f"| {r['partition_bytes'] / MiB:.2f} / {r['credit_bytes'] / MiB:.2f} "
                     f"| {r['derived_s'] / r['prophet_s']:.3f} | {r['original_s'] / r['prophet_s']:.3f} |")
    derived = [r["derived_s"] / r["prophet_s"] for r in rows]
    original = [r["original_s"] / r["prophet_s"] for r in rows]
    lines.append("")
    lines.append(f"{len(rows)} settings: derived sizes at most {max(derived):.3f}x prophet "
                 f"(mean {sum(derived) / len(derived):.3f}); the original's at most {max(original):.3f}x "
                 f"(mean {sum(original) / len(original):.3f}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--table", help="print the table of a JSON written before (no simulation)")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)["rows"]))
        return 0
    rows = run()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
            f.write("\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
