"""Two policies compared over repeated bench runs, to tell a gap between them from noise.

    python benchmarks/repeated_runs.py --runs 4 --json OUT.json -- BENCH-ARGS --policy A,B
    python benchmarks/repeated_runs.py --table OUT.json

runs ``gradsched bench BENCH-ARGS --json`` ``--runs`` times, one after another, each with a
fresh set of rank processes (so a fresh probe of the link, and for a policy that derives
sizes from it, its own sizes). Every other run reverses the order of the policies, so
neither always runs first in a launch. For each run it keeps the whole bench output and the
share of the host's CPU time stolen by other guests over it (``/proc/stat``; a busy
neighbour shows there, not in this machine's load). It prints, and ``--table`` prints from
the JSON, a markdown table: per run both iteration times, their ratio, the bound, the
steal share and the sizes a policy derived from the link (its plan's, as the run reported
them), and a last line with the median ratio and its range over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from gradsched.bench.report import derived_options
from gradsched.units import format_bytes


def _cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of the host's CPUs so far (the first line of /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def _policies(bench_args: list[str]) -> list[str]:
    for flag, value in zip(bench_args, bench_args[1:]):
        if flag == "--policy":
            policies = value.split(",")
            if len(policies) == 2:
                return policies
    raise SystemExit("repeated_runs: give the bench exactly two policies: --policy A,B")


def _with_order(bench_args: list[str], order: list[str]) -> list[str]:
    args = list(bench_args)
    args[args.index("--policy") + 1] = ",".join(order)
    return args


def measure(bench_args: list[str], runs: int) -> dict:
    policies = _policies(bench_args)
    done = []
    for k in range(runs):
        order = policies if k % 2 == 0 else policies[::-1]
        args = _with_order(bench_args, order)
        print(f"repeated_runs [{k + 1}/{runs}]: gradsched bench {' '.join(args)}", file=sys.stderr, flush=True)
        steal0, total0 = _cpu_times()
        started = time.time()
        out = subprocess.run([sys.executable, "-m", "gradsched", "bench", *args, "--json"], check=True,
                             stdout=subprocess.PIPE, text=True)  # this interpreter's gradsched, whatever PATH says
        steal1, total1 = _cpu_times()
        done.append({"order": order, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
                     "host_steal": (steal1 - steal0) / max(total1 - total0, 1), "bench": json.loads(out.stdout)})
    return {"command": "gradsched bench " + " ".join(bench_args), "policies": policies, "runs": done}


def _time(bench: dict, policy: str) -> float:
    return next(r["iteration_s"] for r in bench["results"] if r["policy"] == policy)


def ratios(data: dict) -> list[float]:
    """Per run, the first policy's iteration time over the second's."""
    a, b = data["policies"]
    return [_time(run["bench"], a) / _time(run["bench"], b) for run in data["runs"]]


def _sizes(bench: dict) -> str:
    """The sizes each policy of a run derived from the link, as its plan in use had them."""
    said = []
    for row in bench["results"]:
        derived = derived_options(row["policy"], row.get("plan_options"))
        if derived:  # partition before credit
            said.append(f"{row['policy']}: " + ", ".join(f"{k.removesuffix('_bytes')} {format_bytes(v)}"
                                                          for k, v in sorted(derived.items(), reverse=True)))
    return "; ".join(said)


def table(data: dict) -> str:
    a, b = data["policies"]
    lines = [f"| run (UTC) | order | {a} ms | {b} ms | {a} / {b} | bound ms | host steal | sizes derived |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for run, ratio in zip(data["runs"], ratios(data)):
        bench = run["bench"]
        lines.append(f"| {run['started']} | {', '.join(run['order'])} | {_time(bench, a) * 1e3:.0f} | "
                     f"{_time(bench, b) * 1e3:.0f} | {ratio:.3f} | {bench['settings'][-1]['bound_s'] * 1e3:.0f} | "
                     f"{run['host_steal']:.0%} | {_sizes(bench)} |")
    spread = ratios(data)
    lines.append(f"| median of {len(spread)} | | | | {statistics.median(spread):.3f} "
                 f"({min(spread):.3f}-{max(spread):.3f}) | | | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="bench runs (default 4)")
    parser.add_argument("--json", metavar="OUT", help="write every run's output and the steal shares here")
    parser.add_argument("--table", metavar="FILE", help="print the table of a JSON this script wrote, and stop")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: gradsched bench's arguments")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if args.runs < 2:
        parser.error("--runs must be at least 2 (every other run reverses the order)")
    data = measure(bench_args, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
