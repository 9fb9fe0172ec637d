"""Markdown tables from ``gradsched bench --json`` output, as in the README.

    gradsched bench ... --json > out.json && python benchmarks/bench_table.py out.json

One row per bandwidth; each cell is "iteration ms (the simulator's prediction) / ratio to
the bound / speed-up over the reference" (DDP, or fifo with parameter servers); a * marks
a policy that lost its measured trial and ran DDP-style buckets.
"""

from __future__ import annotations

import json
import sys


def table(data: dict) -> str:
    results = data["results"]
    reference = "fifo" if data.get("arch") == "ps" else "ddp"
    policies = list(dict.fromkeys(r["policy"] for r in results))
    servers = f" + {data['servers']} servers" if data.get("arch") == "ps" else ""
    lines = [f"**{data['model']}**, {data['workers']} workers{servers} ({data.get('description', '')})", "",
             "| Gbit/s | compute ms | comm ms | " + " | ".join(policies) + " |",
             "|---:|---:|---:|" + "---:|" * len(policies)]
    for setting in data["settings"]:
        bandwidth = setting["bandwidth_gbps"]
        cells = []
        for policy in policies:
            row = next(r for r in results if r["policy"] == policy and r["bandwidth_gbps"] == bandwidth)
            fell_back = "*" if row.get("plan") == "fifo" and policy.partition("+")[0] != "fifo" else ""
            predicted = f" ({row['predicted_s'] * 1e3:.0f})" if row.get("predicted_s") else ""
            gain = row.get(f"speedup_vs_{reference}")
            cells.append(f"{row['iteration_s'] * 1e3:.0f}{predicted} / {row['ratio_to_bound']:.2f}"
                         + (f" / {gain:.2f}x{fell_back}" if gain else fell_back))
        where = "loopback" if bandwidth is None else f"{bandwidth:g}"
        lines.append(f"| {where} | {setting['compute_s'] * 1e3:.0f} | {setting['comm_s'] * 1e3:.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(table(json.load(f)))
