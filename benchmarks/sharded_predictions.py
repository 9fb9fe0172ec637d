"""The bench's sharded and fully sharded rows predicted again from their own measurements (the
compute time and the link a run measured, in its JSON) by the simulator as it is now, beside
what the bench predicted when it ran:

    python benchmarks/sharded_predictions.py docs/figures/bench-memory-sharded-resnet50-k3-issue57.json \
        docs/figures/bench-fully-sharded-vgg16-k3-gathers-first.json

Three predictions per row: the one recorded in the JSON; the simulator with neither the
gradient budget nor (fully sharded) the policy, each layer's gradients reduce-scattered in
turn; and the simulator now, which runs the policy's reduce-scatters on the link the gathers
use and holds the backward pass at the runtime's default gradient budget. Only rows of runs
that used the default budgets and the replay's batch of 96 are meaningful here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from gradsched.bench.workloads import workload
from gradsched.core import policy_config
from gradsched.core.estimator import MeasuredLink
from gradsched.sim import simulate
from gradsched.sim.fsdp import PER_LAYER
from gradsched.sim.predict import link_cluster, predict, scaled


def rows(path: str, batch: int) -> list[dict]:
    run = json.load(open(path))
    setting = run["settings"][0]
    table = workload(run["model"], batch, "v100").table
    if table is None:
        raise SystemExit(f"{path}: {run['model']} is not a replay model (no layer table to simulate)")
    link = MeasuredLink(setting["message_latency_s"], setting["message_overhead_s"],
                        setting["comm_s"] / table.gradient_bytes)
    sharded = link_cluster(link, run["workers"], sharded=True)
    model = scaled(table, setting["compute_s"])
    out = []
    for row in run["results"]:
        if "+" not in row["policy"]:
            continue
        policy, arch = row["policy"].split("+")
        cluster = replace(sharded, arch=arch)
        config = policy_config(policy)
        rounds = config.build().warmup_iterations + 6
        before = simulate(model, cluster, PER_LAYER if arch == "fully_sharded" else config, iterations=rounds,
                          record=False, hold_bytes=None).iteration_s
        out.append({"run": f"{run['model']} {row['policy']}", "measured_s": row["iteration_s"],
                    "recorded_s": row.get("predicted_s"), "without_s": before,
                    "now_s": predict(model, cluster, config)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="bench JSON files (gradsched bench --json)")
    parser.add_argument("--batch", type=int, default=96, help="the replay's batch the runs used (default 96)")
    args = parser.parse_args()
    print("| run | measured ms | predicted then | per layer, no budget | predicted now | now vs measured |")
    print("|---|---|---|---|---|---|")
    for path in args.runs:
        for r in rows(path, args.batch):
            then = "" if r["recorded_s"] is None else f"{r['recorded_s'] * 1e3:.0f}"
            print(f"| {r['run']} | {r['measured_s'] * 1e3:.0f} | {then} | {r['without_s'] * 1e3:.0f} | "
                  f"{r['now_s'] * 1e3:.0f} | {r['now_s'] / r['measured_s'] - 1:+.1%} |")


if __name__ == "__main__":
    main()
