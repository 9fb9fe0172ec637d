"""The benchmark's report: its figures as JSON (what docs/figures commits and the tables are
generated from) and as the text ``gradsched bench`` prints."""

from __future__ import annotations

from typing import Sequence

from ..control.ranks import whose_link
from ..core.policies import POLICIES, is_buckets
from ..sim.bounds import raises_bound
from ..units import format_bytes
from .config import BenchConfig
from .dilation import AUTO_CPU_SHARE, AUTO_RUN_SHARE
from .figures import Setting
from .workloads import workload


def settings_json(config: BenchConfig, settings: Sequence[Setting]) -> dict:
    work = workload(config.model, config.batch, config.device)
    return {
        "model": config.model,
        "replay": work.replay,
        "description": work.description,
        "workers": config.workers,
        "arch": config.arch,
        "servers": config.servers,
        "latency_s": config.latency_s,
        "compression": config.compression,
        "procs_per_node": config.procs_per_node,
        "launcher": config.launcher,
        "straggler": config.straggler.as_json() if config.straggler is not None else None,
        "plan_on_slow_rank": config.plan_on_slow_rank,
        "mtu": config.mtu,
        "dilation": settings[0].dilation if settings else 1.0,
        "dilation_auto": None if not settings or settings[0].dilation_busy is None else {
            "host_cpu_busy_comm_undilated": settings[0].dilation_busy, "target": AUTO_CPU_SHARE,
            "runs_target": AUTO_RUN_SHARE, "calibrations": settings[0].dilation_history},
        "emulated_network": all(s.limited for s in settings),
        "settings": [{"bandwidth_gbps": None if s.bandwidth_bps is None else s.bandwidth_bps / 1e9,
                      "compute_s": s.compute_s, "comm_s": s.comm_s, "bound_s": s.bound_s,
                      "dependency_bound_s": s.dependency_bound_s,
                      "message_latency_s": s.latency_s, "message_overhead_s": s.overhead_s,
                      "host_cpu_busy_compute": s.cpu_compute, "host_cpu_busy_comm": s.cpu_comm,
                      "comm_servers_s": s.comm_servers_s, "host_cpu_busy_comm_servers": s.cpu_comm_servers,
                      "comm_wire_s": s.comm_wire_s, "cast_s_per_byte": s.cast_s_per_byte,
                      "compute_modes": s.modes, "balance_calibration": s.calibration} for s in settings],
        "results": [row.as_json(config.with_servers) for s in settings for row in s.rows],
    }


def _dependency_note(s: Setting) -> str:
    if not raises_bound(s.dependency_bound_s, s.bound_s):
        return ""
    return (f" ({s.dependency_bound_s * 1e3:.1f} ms respecting when gradients exist and are needed: "
            f"best {min(row.iteration_s for row in s.rows) / s.dependency_bound_s:.3f}x of it)")


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / (1 << 20):.1f}"


def settings_text(config: BenchConfig, settings: Sequence[Setting]) -> str:
    work = workload(config.model, config.batch, config.device)
    lines = []
    for s in settings:
        where = f"{s.bandwidth_bps / 1e9:.3g} Gbit/s per link (tc)" if s.limited else "loopback, NO bandwidth limit"
        if s.calibration:
            where += ", the balance point (" + " -> ".join(
                f"{c['bandwidth_gbps']:.3g} Gbit/s: compute {c['compute_s'] * 1e3:.0f} / comm {c['comm_s'] * 1e3:.0f} ms"
                for c in s.calibration) + ")"
        arch = f" + {config.servers} parameter servers" if config.with_servers else ""
        hosts = f" on {config.hosts} hosts of {config.procs_per_node}" if config.procs_per_node > 1 else ""
        hosts += ", one torchrun per host" if config.launcher == "torchrun" else ""
        lines.append(f"{config.model}{' [REPLAY]' if work.replay else ''} · {config.workers} workers{arch}{hosts} · {where}"
                     + (f" · latency {config.latency_s * 1e3:g} ms" if config.latency_s else ""))
        lines.append(f"  {work.description}")
        if config.straggler is not None:
            lines.append(f"  straggler: {config.straggler.describe(config.procs_per_node)}; "
                         + ("" if config.plan_on_slow_rank else "rank 0 plans on its own ready times (--own-plans); ") + (
                f"communication below is the mean over 8+ of its periods (its link at "
                f"{config.straggler.rate_share:.0%} of its rate averaged over the clock: the bound every schedule "
                "meets alike), the rows means over their timed iterations "
                "(their periods covered: 'periods' in the JSON)" if config.straggler.link_bursts else
                "communication below is through its link" if config.straggler.link else
                "compute below is its (the bound's)" if config.straggler.steady else
                "compute below is the mean over its bursts, the bound the mean of each iteration's, the rows "
                "means over the timed iterations (whole periods)"))
        if s.dilation != 1 or s.dilation_busy is not None:
            tried = "; ".join(f"K={c['dilation']:g}: busiest run {_percent(c['host_cpu_busy_busiest_run'])}"
                              for c in s.dilation_history or [])
            chosen = "" if s.dilation_busy is None else (
                f" (auto: communicating only kept the host {s.dilation_busy:.0%} busy undilated, target "
                f"{AUTO_CPU_SHARE:.0%}; the runs themselves, target {AUTO_RUN_SHARE:.0%}: {tried or 'not measured'})")
            lines.append(f"  time dilation K={s.dilation:g}{chosen}: replayed compute x{s.dilation:g}, links at "
                         f"1/{s.dilation:g} of the rate, latency x{s.dilation:g}; every time shown divided by K "
                         "(per-message CPU, Python and TCP timers are not scaled)")
        if config.compression:
            lines.append(f"  compression: gradsched's policies send {config.compression} (the bound is for uncompressed "
                         "gradients; ddp-bf16/ddp-fp16 are DDP with the matching compression hook)")
        lines.append(f"  measured: compute only {s.compute_s * 1e3:.1f} ms, communication only {s.comm_s * 1e3:.1f} ms,"
                     f" bound {s.bound_s * 1e3:.1f} ms{_dependency_note(s)}; per message {s.latency_s * 1e3:.2f} ms alone,"
                     f" {s.overhead_s * 1e3:.2f} ms pipelined")
        if s.comm_wire_s is not None:
            lines.append(f"  compressed: communication only {s.comm_wire_s * 1e3:.1f} ms in {config.compression},"
                         f" casts {s.cast_s_per_byte * 1e9:.3g} ns per wire byte each way (the predictions use both)")
        if s.comm_servers_s is not None:
            lines.append(f"  through the servers: communication only {s.comm_servers_s * 1e3:.1f} ms"
                         f" ({s.comm_servers_s / s.comm_s:.2f}x the link's time for these bytes)")
        busy = [f"{_percent(cpu)} {what}" for cpu, what in ((s.cpu_compute, "computing only"),
                (s.cpu_comm, "communicating only"), (s.cpu_comm_servers, "through the servers")) if cpu is not None]
        if busy:
            lines.append(f"  host CPUs busy: {', '.join(busy)} (the ranks and the network's kernel work share them)")
        lines.extend(_rows(config, s))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _rows(config: BenchConfig, s: Setting) -> list[str]:
    """The table of one setting's runs, and the slow rank each named."""
    lines = []
    versus = f"vs {config.reference}"
    width = max([14] + [len(row.policy) for row in s.rows])
    lines.append(f"  {'policy':<{width}} {'iter ms':>9} {'x bound':>8} {versus:>7} {'predicted':>10} {'cpu':>4} "
                 f"{'peak MiB':>8} {'alloc MiB':>9}  plan")
    for row in s.rows:
        predicted = f"{row.predicted_s * 1e3:8.1f}ms" if row.predicted_s else f"{'-':>10}"
        gain = row.speedup(config.reference)
        speedup = f"{gain:6.3f}x" if gain else f"{'-':>7}"
        plan = row.plan
        shown = (row.report.autotune or {}).get("best_options") or derived_options(plan, row.report.plan_options)
        if shown and not is_buckets(plan):
            plan += " (" + ", ".join(f"{k}={format_bytes(v) if k.endswith('_bytes') else f'{v:.3g}'}"
                                     for k, v in shown.items()) + ")"
        lines.append(f"  {row.policy:<{width}} {row.iteration_s * 1e3:9.1f} {row.ratio_to_bound:8.3f} "
                     f"{speedup} {predicted} {_percent(row.host_cpu_busy):>4} "
                     f"{_mib(row.report.peak_memory_bytes):>8} {_mib(row.report.peak_allocated_bytes):>9}  {plan}")
    periods = [row.periods for row in s.rows if row.periods is not None]
    if periods:
        lines.append(f"  the link's bursts: each run's timed iterations lasted {min(periods):.1f}-{max(periods):.1f} "
                     f"of its periods (a mean over a part period is off by up to that part's share)")
    named = [f"{row.policy} {said}" for row in s.rows if (said := named_slow(row.report.ranks))]
    if named or config.straggler is not None:
        lines.append("  slow rank named (its backward pass, or its link, against the other ranks' median): "
                     + ("; ".join(named) or "none"))
    return lines


def named_slow(ranks: dict | None) -> str:
    """What a run's ``ranks`` report (RanksReport as a dict) named slow, in words ("" for nobody):
    the slow rank and its ratio, a rank slow in bursts with how often and how much, and a rank
    whose link is slow, throughout or in bursts."""
    if not ranks:
        return ""
    said = [f"rank {ranks['slow_rank']} ({ranks['ratio']:.2f}x)"] if ranks.get("slow_rank") is not None else []
    if ranks.get("burst_rank") is not None:
        said.append(f"rank {ranks['burst_rank']} in bursts ({ranks['burst_rounds']} of {ranks['burst_of']} rounds, "
                    f"up to {ranks['burst_slowest_s'] / ranks['median_s']:.2f}x)")
    per = ranks.get("ranks_per_host") or 1
    if ranks.get("link_rank") is not None:
        said.append(f"{whose_link(ranks['link_rank'], per)} ({ranks['link_ratio']:.2f}x)")
    if ranks.get("link_burst_rank") is not None:
        said.append(f"{whose_link(ranks['link_burst_rank'], per)} in bursts ({ranks['link_burst_probes']} of "
                    f"{ranks['link_probes_of']} probes, up to {ranks['link_burst_ratio']:.2f}x)")
    return ", ".join(said)


def derived_options(policy: str, options: dict | None) -> dict:
    """Of a plan's ``options``, those its policy derives from the link by default (its
    defaults left as None): what the run chose for them."""
    if policy not in POLICIES or not options:
        return {}
    defaults = POLICIES[policy]()
    return {k: v for k, v in options.items() if v is not None and getattr(defaults, k, 0) is None}
