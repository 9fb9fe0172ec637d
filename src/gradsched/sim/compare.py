"""Compare policies on one model over one or more clusters: the engine of ``gradsched simulate``.

>>> from gradsched.models.table import Layer, ModelTable, ParamSpec
>>> model = ModelTable("tiny", tuple(Layer(f"l{i}", 1e-3, 2e-3, (ParamSpec(f"w{i}", 10**6),)) for i in range(4)))
>>> rows = compare(model, [Cluster(workers=4, bandwidth_bps=10e9)], ["fifo", "bytescheduler"], iterations=6)
>>> [(r.policy, round(r.speedup_vs_fifo, 2)) for r in rows]
[('fifo', 1.0), ('bytescheduler', 1.19)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core import policy_config
from ..core.base import PolicyConfig
from ..models.table import ModelTable
from ..units import format_bandwidth
from .bounds import raises_bound
from .cluster import Cluster
from .simulator import SimResult, simulate


@dataclass
class Row:
    result: SimResult
    speedup_vs_fifo: float

    @property
    def policy(self) -> str:
        return self.result.policy

    @property
    def bandwidth_gbps(self) -> float:
        return self.result.cluster.bandwidth_bps / 1e9

    def as_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "policy": r.policy,
            "bandwidth_gbps": self.bandwidth_gbps,
            "iteration_s": r.iteration_s,
            "bound_s": r.bound_s,
            "dependency_bound_s": r.dependency_bound_s,
            "ratio_to_bound": r.ratio_to_bound,
            "speedup_vs_fifo": self.speedup_vs_fifo,
            "compute_s": r.compute_s,
            "comm_s": r.comm_s,
            "link_utilisation": r.link_utilisation,
            "config": r.config,
        }


def compare(
    model: ModelTable,
    clusters: Sequence[Cluster],
    policies: Sequence[PolicyConfig | str],
    iterations: int = 30,
    record: bool = False,
    progress: Callable[[str], None] | None = None,
    **budgets: int | None,
) -> list[Row]:
    """Simulate every policy on every cluster. fifo is always simulated as the reference
    for ``speedup_vs_fifo``; it gets a row only if asked for. ``budgets``: the sharded
    architectures' (``simulate``'s ``hold_bytes`` and ``gather_budget_bytes``)."""
    configs = [policy_config(p) if isinstance(p, str) else p for p in policies]
    rows = []
    for cluster in clusters:
        fifo = next((c for c in configs if c.name == "fifo"), None)
        reference = simulate(model, cluster, fifo or policy_config("fifo"), iterations, record, **budgets)
        for config in configs:
            if progress:
                progress(f"{config.name} at {format_bandwidth(cluster.bandwidth_bps)}")
            result = reference if config is fifo else simulate(model, cluster, config, iterations, record, **budgets)
            rows.append(Row(result, reference.iteration_s / result.iteration_s))
    return rows


def rows_json(model: ModelTable, rows: Sequence[Row], iterations: int) -> dict[str, Any]:
    cluster = rows[0].result.cluster
    return {
        "model": model.name,
        "workers": cluster.workers,
        "arch": cluster.arch,
        "servers": cluster.num_servers if cluster.kind.servers else None,
        "latency_s": cluster.latency_s,
        "table": {
            "num_params": model.num_params,
            "gradient_bytes": model.gradient_bytes,
            "layers": len(model.layers),
            "compute_s": model.compute_s,
            **model.meta,
        },
        "iterations": iterations,
        "results": [row.as_dict() for row in rows],
    }


def rows_text(model: ModelTable, rows: Sequence[Row]) -> str:
    """One table per bandwidth: policy, iteration, bound, ratio, speedup, utilisation."""
    out = []
    meta = ", ".join(f"{k} {v}" for k, v in model.meta.items() if k in ("device", "batch", "seq_len", "source"))
    by_setting: dict[float, list[Row]] = {}
    for row in rows:
        by_setting.setdefault(row.result.cluster.bandwidth_bps, []).append(row)
    for group in by_setting.values():
        first = group[0].result
        gib = model.gradient_bytes / 2**20
        out.append(
            f"{model.name} ({model.num_params / 1e6:.1f}M params, {gib:.0f} MiB of gradients{', ' + meta if meta else ''})"
            f" · {first.cluster.describe()}"
        )
        out.append(
            f"compute {first.compute_s * 1e3:.1f} ms, communication {first.comm_s * 1e3:.1f} ms, "
            f"bound {first.bound_s * 1e3:.1f} ms"
            + (f" ({first.dependency_bound_s * 1e3:.1f} ms respecting when gradients exist and are needed)"
               if raises_bound(first.dependency_bound_s, first.bound_s) else "")
        )
        out.append(f"  {'policy':<14} {'iter ms':>9} {'bound ms':>9} {'x bound':>8} {'vs fifo':>8} {'link':>6}")
        for row in group:
            r = row.result
            util = "" if r.link_utilisation != r.link_utilisation else f"{100 * r.link_utilisation:5.0f}%"
            out.append(
                f"  {r.policy:<14} {r.iteration_s * 1e3:9.2f} {r.bound_s * 1e3:9.2f} {r.ratio_to_bound:8.3f} "
                f"{row.speedup_vs_fifo:7.3f}x {util:>6}"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"
