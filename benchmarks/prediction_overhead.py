"""How much of a bench row's prediction is the link's per-message overhead: re-predict the
policies of a ``gradsched bench --json`` output with the overhead as measured, halved and
zero, next to the measured times and the messages each policy sends per iteration.

    python benchmarks/prediction_overhead.py FILE.json BATCH

(BATCH: the replay model's batch the bench ran.) The simulator charges the overhead, measured
with tiny messages, serially to every message; where a policy's figures fit the zero row
better, its messages' overheads overlapped the transfers ahead of them on the real link.
"""

from __future__ import annotations

import json
import sys

from gradsched.bench.workloads import workload
from gradsched.core import MeasuredLink, policy_config
from gradsched.sim import link_cluster, scaled, simulate

ITERATIONS = 8


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    setting = data["settings"][-1]
    work = workload(data["model"], int(argv[1]), "v100")
    table = scaled(work.table, setting["compute_s"])
    measured = {r["policy"]: r["iteration_s"] for r in data["results"] if r["bandwidth_gbps"] == setting["bandwidth_gbps"]}
    per_byte = setting["comm_s"] / work.table.gradient_bytes
    overhead = setting["message_overhead_s"]
    print(f"{data['model']} batch {argv[1]} at {setting['bandwidth_gbps']} Gbit/s: latency "
          f"{setting['message_latency_s'] * 1e3:.2f} ms, overhead {overhead * 1e3:.2f} ms per message")
    print(f"  {'overhead':<12} {'policy':<14} {'predicted':>9} {'measured':>9} {'messages':>9}")
    for label, factor in (("as measured", 1.0), ("half", 0.5), ("none", 0.0)):
        link = MeasuredLink(setting["message_latency_s"], overhead * factor, per_byte)
        cluster = link_cluster(link, data["workers"], data.get("servers") or 0)
        for policy in (p for p in ("fifo", "bytescheduler", "prophet") if p in measured):
            result = simulate(table, cluster, policy_config(policy), iterations=ITERATIONS, record=True)
            print(f"  {label:<12} {policy:<14} {result.iteration_s * 1e3:8.0f}  {measured[policy] * 1e3:8.0f}  "
                  f"{len(result.messages) / ITERATIONS:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
