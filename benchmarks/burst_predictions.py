"""The simulator's predictions of bench runs whose straggler's link is slowed in bursts by the
clock (``--straggler RANK:FACTOR:link:burst=SLOW/PERIOD``), on two models of that link: its
rate averaged over the clock (steady), and the fast rate slowed in the same bursts
(gradsched.sim.cluster.LinkBursts, what the bench predicts since the bursts were modelled).
DDP is simulated as its 25 MiB buckets, each policy as the plan and options it ran:

    python benchmarks/burst_predictions.py docs/figures/bench-straggler-linkburst2x200of400ms-resnet50-k3.json ...

Prints one markdown table: each row's measured iteration and both predictions with their errors.
"""

from __future__ import annotations

import argparse
import json

from gradsched.bench.figures import measured_setting
from gradsched.bench.straggler import Straggler
from gradsched.core import policy_config
from gradsched.core.policies import FifoConfig, is_buckets
from gradsched.sim.predict import averaging, link_cluster, predict


def ran(row: dict):
    """What a row ran: DDP's buckets for DDP and for a policy that fell back, else its plan."""
    plan = row.get("plan") or row["policy"]
    if row["policy"] == "ddp" or is_buckets(plan):
        return FifoConfig.ddp_buckets()
    return policy_config(plan, **(row.get("plan_options") or {}))


def rows(path: str, batch: int) -> list[str]:
    run = json.load(open(path))
    straggler = Straggler.from_json(run.get("straggler"))
    if straggler is None or not straggler.link_bursts:
        raise SystemExit(f"{path}: not a run with a link slowed in bursts (--straggler RANK:FACTOR:link:burst=S/P)")
    model, link = measured_setting(run, batch)
    steady = link_cluster(link, run["workers"])  # the rate averaged over the clock, as measured
    bursty = averaging(steady, straggler.bursts)
    out = []
    for row in run["results"]:
        measured = row["iteration_s"]
        cells = []
        for cluster in (steady, bursty):
            predicted = predict(model, cluster, ran(row))
            cells.append(f"{predicted * 1e3:.0f} ({(predicted / measured - 1) * 100:+.1f}%)")
        out.append(f"| {path.rsplit('/', 1)[-1].removesuffix('.json')} | {run['workers']} | {row['policy']} | "
                   f"{measured * 1e3:.0f} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="bench JSON files of runs with a link slowed in bursts")
    parser.add_argument("--batch", type=int, default=96, help="the runs' batch (default 96)")
    args = parser.parse_args(argv)
    lines = ["| run | workers | policy | measured ms | steady link ms | link in bursts ms |",
             "|---|---:|---|---:|---:|---:|"]
    for path in args.runs:
        lines += rows(path, args.batch)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
