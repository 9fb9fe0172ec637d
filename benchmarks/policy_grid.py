"""Every policy over a grid of settings in the simulator: is the project's best policy ever
behind the best of fifo (DDP) and bytescheduler?

    python benchmarks/policy_grid.py [--models ...] [--workers 4,16,64] [--archs allreduce,ps]
                                     [--bandwidths 1,3,10,25,100] [--policy prophet] [--cases] [--json FILE]
    python benchmarks/policy_grid.py --summary FILE     # the summary again, from the JSON

Each case is one model, worker count, architecture and bandwidth (V100 preset, batch 32,
50 us latency unless --latency, no per-message cost unless --overhead, each policy with its
default options). Printed: for the policy under test,
how many cases it is more than 1%, 2% and 5% slower than the best of fifo and bytescheduler,
the worst case, how many it is ahead by more than 1%, and (--cases) every case. ``--json``
writes the cases (docs/figures/sim-policy-grid.json, which docs/simulator.md's summary is
checked against).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

from gradsched.core import policy_config
from gradsched.models import model_table
from gradsched.sim import Cluster, predict
from gradsched.units import parse_duration

REFERENCES = ("fifo", "bytescheduler")


def grid(models, workers, archs, bandwidths, policy: str, progress=None, latency_s: float = 50e-6,
         overhead_s: float = 0.0) -> list[dict]:
    cases = []
    settings = list(itertools.product(models, workers, archs, bandwidths))
    tables = {name: model_table(name) for name in models}
    for k, (name, n, arch, gbps) in enumerate(settings):
        cluster = Cluster(n, bandwidth_bps=gbps * 1e9, latency_s=latency_s, arch=arch, overhead_s=overhead_s)
        times = {p: predict(tables[name], cluster, policy_config(p)) for p in (*REFERENCES, policy)}
        best = min(times[p] for p in REFERENCES)
        cases.append({"model": name, "workers": n, "arch": arch, "gbps": gbps, "times": times,
                      "behind": times[policy] / best - 1.0})
        if progress:
            progress(k + 1, len(settings))
    return cases


def summary(cases: list[dict], policy: str) -> str:
    behind = [c["behind"] for c in cases]
    worst = max(cases, key=lambda c: (round(c["behind"], 4), _label(c)))  # ties: the same case on every machine
    lines = [f"{policy} against the best of {' and '.join(REFERENCES)}, {len(cases)} cases:"]
    for threshold in (0.01, 0.02, 0.05):
        lines.append(f"  more than {threshold:.0%} slower: {sum(b > threshold for b in behind)}")
    lines.append(f"  more than 1% faster: {sum(b < -0.01 for b in behind)}")
    lines.append(f"  worst: {worst['behind']:+.1%} ({_label(worst)})")
    return "\n".join(lines)


def _label(case: dict) -> str:
    return f"{case['model']} {case['workers']}w {case['arch']} {case['gbps']:g}G"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg16,resnet50,resnet152,transformer,bert-large")
    parser.add_argument("--workers", default="4,16,64")
    parser.add_argument("--archs", default="allreduce,ps")
    parser.add_argument("--bandwidths", default="1,3,10,25,100", help="Gbit/s")
    parser.add_argument("--policy", default="prophet")
    parser.add_argument("--latency", default="50us", help="per-message latency (default 50us)")
    parser.add_argument("--overhead", default="0", help="serial per-message cost, e.g. 0.7ms (default 0)")
    parser.add_argument("--cases", action="store_true", help="print every case")
    parser.add_argument("--json", metavar="FILE", help="also write the policy and the cases as JSON")
    parser.add_argument("--summary", metavar="FILE", help="print the summary of a JSON written by --json")
    args = parser.parse_args()
    if args.summary:
        with open(args.summary) as f:
            data = json.load(f)
        print(summary(data["cases"], data["policy"]))
        return
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total} cases\x1b[K", end="", file=sys.stderr, flush=True)

    cases = grid(args.models.split(","), [int(w) for w in args.workers.split(",")], args.archs.split(","),
                 [float(b) for b in args.bandwidths.split(",")], args.policy, progress,
                 parse_duration(args.latency), parse_duration(args.overhead))
    if sys.stderr.isatty():
        print("\r\x1b[K", end="", file=sys.stderr)
    if args.cases:
        for c in sorted(cases, key=lambda c: -c["behind"]):
            times = "  ".join(f"{p} {t * 1e3:8.1f}" for p, t in c["times"].items())
            print(f"{_label(c):<28} {c['behind']:+6.1%}  {times}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"policy": args.policy, "latency_s": parse_duration(args.latency),
                       "overhead_s": parse_duration(args.overhead), "cases": cases}, f, indent=1)
    print(summary(cases, args.policy))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
