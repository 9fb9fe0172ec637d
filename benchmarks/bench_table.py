"""Markdown tables from ``gradsched bench --json`` output, as in docs/bench.md and the README.

    gradsched bench ... --json > out.json && python benchmarks/bench_table.py out.json

One row per bandwidth: compute and communication alone, the bound max(compute,
communication) and in brackets the dependency bound where it is higher (when gradients
exist and are needed: gradsched.sim.bounds); each policy's cell is "iteration ms (the
simulator's prediction) / ratio to the bound / speed-up over the reference" (DDP, or fifo with parameter servers); a * marks
a policy that lost its measured trial and ran DDP-style buckets. Where the JSON has them,
a column gives how busy the host's CPUs were computing only / communicating only / [through
the servers /] over the policies' runs (lowest-highest), and with parameter servers a
column gives the communication alone through the servers (docs/bench.md); with ``--compression``,
a column gives the communication alone in the wire dtype (what the compressed runs' predictions use); where runs
hold different optimizer state per rank (``--sharded``, ``ddp-zero``, ``fsdp2``), a line after the table gives each
run's, measured, and one its peak memory per rank (gradsched.bench.memory). A run with ``--straggler``
says so in its title, with the rank gradsched named slow (compute and the bound are then the slow rank's;
in bursts, their means, and each cell the mean iteration). Runs with ``--autotune``
get a second table: per tuned policy, the starting options and what the online tuner
kept, each with its measured arm time, and the final iteration times untuned and tuned.

    python benchmarks/bench_table.py --tuning "LABEL=FILE.json" ...

prints one such table for several runs, each row labelled (and DDP's time, placed where
the label says "{ddp}", or after it), as in docs/bench.md.

    python benchmarks/bench_table.py --headline

prints the README's table: each workload of ``HEADLINE`` at its balance point (of the
settings in its JSON, the one whose compute and communication alone are closest).
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

from gradsched.bench.report import named_slow
from gradsched.bench.straggler import Straggler
from gradsched.sim.bounds import raises_bound


def _where(bandwidth_gbps: float | None) -> str:
    return "loopback" if bandwidth_gbps is None else f"{bandwidth_gbps:g}"


def _bounds(setting: dict) -> str:
    """The bound, and after it the dependency bound where that is higher (replay models)."""
    plain, tight = setting["bound_s"], setting.get("dependency_bound_s")
    return f"{plain * 1e3:.0f}" + (f" ({tight * 1e3:.0f})" if raises_bound(tight, plain) else "")


def _host_cpu(setting: dict, rows: list[dict]) -> str:
    """CPU busy %: compute only / communication only / [through the servers /] the
    policies' runs (lowest-highest)."""
    alone = [setting[k] * 100 for k in ("host_cpu_busy_compute", "host_cpu_busy_comm", "host_cpu_busy_comm_servers")
             if setting.get(k) is not None]
    runs = sorted(r["host_cpu_busy"] * 100 for r in rows if r.get("host_cpu_busy") is not None)
    spread = f"{runs[0]:.0f}-{runs[-1]:.0f}" if runs else "-"
    return " / ".join(f"{v:.0f}" for v in alone) + f" / {spread}"


def table(data: dict) -> str:
    results = data["results"]
    reference = "fifo" if data.get("arch") == "ps" else "ddp"
    policies = list(dict.fromkeys(r["policy"] for r in results))
    servers = f" + {data['servers']} servers" if data.get("arch") == "ps" else ""
    host = all(s.get("host_cpu_busy_compute") is not None for s in data["settings"])
    through = all(s.get("comm_servers_s") is not None for s in data["settings"])
    wire = all(s.get("comm_wire_s") is not None for s in data["settings"])  # --compression
    extra = ([f"{data['compression']} comm ms"] if wire else []) + (["through servers ms"] if through else []) \
        + (["CPU busy %"] if host else [])
    dilated = f", time dilation K={data['dilation']:g} (times / K)" if data.get("dilation", 1) != 1 else ""
    straggler = Straggler.from_json(data.get("straggler"))
    if straggler is not None:  # the compute column and the bound are then the slow rank's (or through its link)
        named = sorted({said for r in results if (said := named_slow(r.get("ranks")))})
        periods = [r["periods"] for r in results if r.get("periods") is not None]
        whose = ("communication is the mean over the clock through its link, each cell the mean iteration over "
                 f"{min(periods):.1f}-{max(periods):.1f} periods" if straggler.link_bursts else
                 "communication is through its link" if straggler.link else "compute and the bound are its"
                 if straggler.steady else "compute is the mean over its bursts, each cell the mean iteration")
        own = "; rank 0 planned on its own ready times" if data.get("plan_on_slow_rank") is False else ""
        dilated += (f", straggler: {straggler.describe(data.get('procs_per_node') or 1)} ({whose}; gradsched named "
                    f"{', '.join(named) or 'none'}{own})")

    per_host = data.get("procs_per_node") or 1
    hosts = f" on {(data['workers'] + (data.get('servers') or 0)) // per_host} hosts of {per_host} ranks" \
        if per_host > 1 else ""
    lines = [f"**{data['model']}**, {data['workers']} workers{servers}{hosts} ({data.get('description', '')}){dilated}",
             "",
             "| Gbit/s | compute ms | comm ms | " + "".join(f"{e} | " for e in extra) + "bound ms | "
             + " | ".join(policies) + " |",
             "|---:|---:|---:|" + "---:|" * len(extra) + "---:|" + "---:|" * len(policies)]
    for setting in data["settings"]:
        bandwidth = setting["bandwidth_gbps"]
        rows = [r for r in results if r["bandwidth_gbps"] == bandwidth]
        measured = ([f"{setting['comm_wire_s'] * 1e3:.0f}"] if wire else []) \
            + ([f"{setting['comm_servers_s'] * 1e3:.0f}"] if through else []) + ([_host_cpu(setting, rows)] if host else [])
        cells = []
        for policy in policies:
            row = next(r for r in results if r["policy"] == policy and r["bandwidth_gbps"] == bandwidth)
            fell_back = "*" if row.get("plan") == "fifo" and policy.partition("+")[0] != "fifo" else ""
            predicted = f" ({row['predicted_s'] * 1e3:.0f})" if row.get("predicted_s") else ""
            gain = row.get(f"speedup_vs_{reference}")
            cells.append(f"{row['iteration_s'] * 1e3:.0f}{predicted} / {row['ratio_to_bound']:.2f}"
                         + (f" / {gain:.2f}x{fell_back}" if gain else fell_back))
        lines.append(f"| {_where(bandwidth)} | {setting['compute_s'] * 1e3:.0f} | {setting['comm_s'] * 1e3:.0f} | "
                     + "".join(f"{m} | " for m in measured) + f"{_bounds(setting)} | " + " | ".join(cells) + " |")
    state = _state(results, policies, "optimizer_state_bytes", "Optimizer state per rank (measured)")
    peak = _state(results, policies, "peak_memory_bytes", "Peak memory per rank (rank 0's resident set, measured)") \
        if state else ""
    allocated = _state(results, policies, "peak_allocated_bytes",
                       "Peak allocated per rank (rank 0's allocator count, measured)") if state else ""
    return "\n".join(lines + [line for text in (state, peak, allocated) if text for line in ("", text)]) + "\n"


def _state(results: list[dict], policies: list[str], key: str, title: str) -> str:
    """Memory per rank, measured (runs that report ``key``), each against the largest."""
    held = {}
    for policy in policies:
        sizes = [r[key] for r in results if r["policy"] == policy and r.get(key) is not None]
        if sizes:
            held[policy] = max(sizes)
    if not held or len(set(held.values())) == 1:
        return ""
    full = max(held.values())
    return f"{title}: " + ", ".join(
        f"{policy} {size / 2**20:.1f} MiB ({size / full:.2f}x)" for policy, size in held.items()) + "."


def _options(options: dict) -> str:
    def show(value) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return f"{value / (1 << 20):.2g} MiB" if value >= 1 << 20 else f"{value / 1024:.0f} KiB"

    return ", ".join(f"{k.removesuffix('_bytes')} {show(v)}" for k, v in options.items())


def tuning_table(data: dict, label: str | None = None) -> str:
    """One row per autotuned run: start -> kept options, arm times, final times. With a
    ``label``, the first column names the run and DDP's time instead of the bandwidth."""
    tuned = [r for r in data["results"] if r.get("autotune")]
    if not tuned:
        return ""
    first = "model (DDP ms)" if label else "Gbit/s"
    lines = [f"| {first} | policy | starting options (arm ms) | kept options (mean of arms ms) | final ms: as set -> "
             "tuned | plan run |", f"|{'---' if label else '---:'}|---|---|---|---|---|"]
    for row in tuned:
        tuning, base = row["autotune"], row["policy"].partition("+")[0]
        same = [r for r in data["results"] if r["bandwidth_gbps"] == row["bandwidth_gbps"]]
        plain = next((r for r in same if r["policy"] == base), None)
        ddp = next((r for r in same if r["policy"] == "ddp"), None)
        start = tuning["history"][0]["options"]
        kept = "the starting ones" if tuning["best_options"] == start else _options(tuning["best_options"])
        before = f"{plain['iteration_s'] * 1e3:.0f} -> " if plain else ""
        where = _where(row["bandwidth_gbps"])
        if label:  # "{ddp}" in the label marks where DDP's time goes (default: after it)
            ddp_ms = f"{ddp['iteration_s'] * 1e3:.0f}" if ddp else "-"
            where = label.replace("{ddp}", ddp_ms) if "{ddp}" in label else f"{label} ({ddp_ms})"
        buckets = "DDP-style buckets" + (f" ({row['trial']['fifo_s'] * 1e3:.0f} ms in its arm)" if row.get("trial") else "")
        lines.append(f"| {where} | {base} | {_options(start)} ({tuning['default_s'] * 1e3:.0f}) | "
                     f"{kept} ({tuning['best_s'] * 1e3:.0f}) | {before}{row['iteration_s'] * 1e3:.0f} | "
                     f"{buckets if row.get('plan') == 'fifo' else base} |")
    return "\n".join(lines) + "\n"


def tuning_summary(labelled: list[tuple[str, dict]]) -> str:
    """One table of the autotuned runs of several JSON files, each row labelled."""
    tables = [tuning_table(data, label).splitlines() for label, data in labelled]
    tables = [t for t in tables if t]
    return "\n".join(tables[0][:2] + [line for t in tables for line in t[2:]]) + "\n" if tables else ""

# The README's headline: (label, JSON under docs/figures, the baseline, the suffix of the scheduled policies' rows)
HEADLINE = (("ResNet-50, 2 workers", "bench-bs-derived-resnet50-b96-k3", "ddp", ""),
            ("Transformer, 2 workers", "bench-bs-derived-transformer-b96-k3", "ddp", ""),
            ("VGG-16, 2 workers", "bench-k3-vgg16-balance", "ddp", ""),
            ("ResNet-50, 2 workers + 2 servers", "bench-k3-ps-resnet50", "fifo", ""),
            ("ResNet-50, 2 workers, sharded (1/2 the optimizer state)", "bench-sharded-resnet50-k3", "ddp-zero",
             "+sharded"))
BASELINES = {"ddp": "DDP", "fifo": "fifo", "ddp-zero": "DDP + ZeRO"}
FIGURES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "figures"


def _balance(data: dict) -> dict:
    """The setting whose compute and communication alone are the closest to equal."""
    return min(data["settings"], key=lambda s: abs(math.log(s["comm_s"] / s["compute_s"])))


def headline(entries=HEADLINE, figures: pathlib.Path = FIGURES) -> str:
    """One row per workload at its balance point: the baseline, bytescheduler and prophet, each
    "ms (ratio to the bound)", and prophet's speed-up over the baseline."""
    rows, dilations = [], set()
    for label, name, baseline, suffix in entries:
        data = json.loads((figures / f"{name}.json").read_text())
        dilations.add(data.get("dilation", 1))
        setting = _balance(data)
        at = {r["policy"]: r for r in data["results"] if r["bandwidth_gbps"] == setting["bandwidth_gbps"]}

        def cell(policy: str) -> str:
            row = at.get(policy)
            return f"{row['iteration_s'] * 1e3:.0f} ({row['ratio_to_bound']:.2f}x)" if row else "-"

        gain = at[baseline]["iteration_s"] / at["prophet" + suffix]["iteration_s"]
        rows.append(f"| {label} | {setting['bandwidth_gbps']:.3g} | {setting['compute_s'] * 1e3:.0f} / "
                    f"{setting['comm_s'] * 1e3:.0f} | {_bounds(setting)} | {BASELINES[baseline]} {cell(baseline)} | "
                    f"{cell('bytescheduler' + suffix)} | {cell('prophet' + suffix)} | {gain:.2f}x |")
    (k,) = dilations
    return "\n".join([f"Balance points, time-dilated K={k:g} (times / K), one run each; each cell: median iteration "
                      "ms (ratio to the bound):", "",
                      "| workload | Gbit/s | compute / comm ms | bound ms | baseline | bytescheduler | prophet | "
                      "prophet vs baseline |", "|---|---:|---:|---:|---|---:|---:|---:|", *rows]) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--headline"]:
        print(headline(), end="")
        raise SystemExit(0)
    if sys.argv[1:2] == ["--tuning"]:  # --tuning "LABEL=FILE.json" ...: one table of the tuned runs (docs/tuning.md)
        runs = []
        for item in sys.argv[2:]:
            label, _, path = item.rpartition("=")
            with open(path) as f:
                runs.append((label, json.load(f)))
        print(tuning_summary(runs), end="")
        raise SystemExit(0)
    for path in sys.argv[1:]:
        with open(path) as f:
            data = json.load(f)
        print(table(data))
        tuned = tuning_table(data)
        if tuned:
            print(tuned)
