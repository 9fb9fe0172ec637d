"""The measured trial where compute and communication share the host: a ResNet of bottleneck
blocks (2, 2, 2, 2) at 64 px, 100 classes, batch 16, SGD with momentum, 2 gloo ranks on
loopback with one intra-op thread each (a CPU model: every millisecond the link takes is one
the cores do not compute in, which the simulator's prediction does not assume). Each run
wraps with the defaults (fallback on: two pairs, up to two extra) and trains ``--steps``
steps; rank 0 prints the trial's choice as the ``gradsched`` logger says it, and the median
of the last ten iterations on the plan kept.

    python benchmarks/cpu_trial.py --policy prophet,bytescheduler --runs 4 --json out.json
    python benchmarks/cpu_trial.py --table docs/figures/cpu-trial.json   # the table of docs/bench.md

One policy run takes about 40 s on a 2-core machine; run nothing else beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, policy: str, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import gradsched
    from gradsched.models.cnn import ResNet

    torch.manual_seed(0)
    model = ResNet((2, 2, 2, 2), num_classes=100)
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), policy)
    generator = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(steps):
        x, y = torch.randn(16, 3, 64, 64, generator=generator), torch.randint(0, 100, (16,), generator=generator)
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    stats = opt.stats
    if rank == 0:
        trial = stats.as_dict()["trial"]
        with open(out, "w") as f:
            json.dump({"policy": policy, "kept": stats.plan_policy, "settled_round": stats.settled_round,
                       "pairs": trial["pairs"], "by": trial["by"], "after_ms": statistics.median(times[-10:]) * 1e3}, f)
    opt.close()
    dist.destroy_process_group()


HEADER = ["| policy | pairs (policy/buckets ms) | kept, by | last ten iterations after it |",
          "|---|---|---|---:|"]


def table(runs: list) -> str:
    """The table of a saved run (``--json``)."""
    rows = [f"| {r['policy']} | {', '.join(f'{p * 1e3:.1f}/{b * 1e3:.1f}' for p, b in r['pairs'])} | "
            f"{'buckets' if r['kept'] == 'fifo' else r['kept']}, {r['by']} | {r['after_ms']:.0f} ms |" for r in runs]
    return "\n".join(HEADER + rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="prophet,bytescheduler", help="comma-separated policies")
    parser.add_argument("--runs", type=int, default=1, help="runs of each policy")
    parser.add_argument("--steps", type=int, default=70, help="steps per run (the trial needs up to 45)")
    parser.add_argument("--json", help="also write the runs here")
    parser.add_argument("--table", help="print the table of a saved run, and run nothing")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)["runs"]), end="")
        return
    runs = []
    for policy in args.policy.split(","):
        for _ in range(args.runs):
            with socket.socket() as s, tempfile.TemporaryDirectory() as tmp:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                s.close()
                out = os.path.join(tmp, "run.json")
                mp.start_processes(_rank, args=(port, policy, args.steps, out), nprocs=2, start_method="spawn")
                with open(out) as f:
                    runs.append(json.load(f))
            print(table(runs[-1:]).splitlines()[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setting": {"model": "ResNet (2, 2, 2, 2) bottleneck, 64 px, batch 16", "world": 2,
                                   "steps": args.steps}, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
