"""The ``gradsched`` command line.

    gradsched simulate --model vgg16 --workers 16 --bandwidth 10Gbit --arch allreduce \\
        --policy fifo,priority,bytescheduler,prophet [--sweep-bandwidth 1,2,5,10,25,100] \\
        [--json] [--trace out.json] [--plot out.png]
    gradsched tune --model resnet50 --workers 16 --bandwidth 10Gbit --policy bytescheduler [--trials 15]
    gradsched profile --model resnet50 --out resnet50.json
    gradsched models

Bad input exits with status 2 and one line that says what to fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .extras import require
from .files import problem_writing
from .progress import Progress
from .cli_args import Parser, UsageError, bandwidths, parse_sets, split_list
from .core import POLICIES, policy_config
from .core.architectures import KINDS, NAMES, kind
from .core.base import PolicyConfig
from .models import DEVICES, MODELS, ModelTable, get_device, model_table
from .sim import Cluster
from .sim.compare import compare, rows_json, rows_text
from .sim.predict import link_bursts, slow_link, straggling
from .units import parse_bytes, parse_duration


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"built-in model: {', '.join(MODELS)} (default resnet50)")
    p.add_argument("--batch", type=int, default=32, help="samples per worker per iteration (default 32)")
    p.add_argument("--device", default="v100", help=f"compute preset: {', '.join(DEVICES)} (default v100)")
    p.add_argument("--classes", type=int, default=1000, help="classifier size of image models (default 1000)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample of text models (default 128)")


def _add_setting_args(p: argparse.ArgumentParser) -> None:
    """A simulated setting: the model (or a profile) and the cluster."""
    _add_model_args(p)
    p.add_argument("--profile", help="measured JSON profile to use instead of --model (docs/profile-format.md)")
    p.add_argument("--workers", type=int, default=16, help="number of workers (default 16)")
    p.add_argument("--bandwidth", help="link bandwidth per worker and direction, e.g. 10Gbit (default 10Gbit)")
    p.add_argument("--latency", default="50us", help="per-message latency, e.g. 50us (default 50us)")
    p.add_argument("--arch", default="allreduce", choices=NAMES,
                   help="communication architecture: " + "; ".join(f"{k.name}: {k.summary}" for k in KINDS))
    p.add_argument("--servers", type=int, default=0, help="parameter servers for --arch ps (default: = workers)")
    p.add_argument("--compression", choices=["bf16", "fp16"],
                   help="gradients travel as bf16/fp16: 2 bytes per element on the wire, and each message is cast "
                        "to it and back")
    p.add_argument("--cast-cost", metavar="DURATION",
                   help="with --compression: time per wire byte of each cast, e.g. 0.25ns (default: from the "
                        "--device preset's memory bandwidth; 'gradsched bench --compression' measures a host's)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gradsched", description="Scheduling of gradient communication: simulator and tools.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    sim = sub.add_parser("simulate", help="compare scheduling policies in the simulator",
                         description="Simulate data-parallel training under each policy and compare iteration "
                                     "times with the bound max(compute, communication).")
    _add_setting_args(sim)
    sim.add_argument("--sweep-bandwidth", help="comma list of bandwidths, bare numbers in Gbit/s: 1,2,5,10")
    sim.add_argument("--policy", default=",".join(POLICIES), help=f"comma list of: {', '.join(POLICIES)}")
    sim.add_argument("--set", action="append", default=[], metavar="POLICY.OPTION=VALUE",
                     help="change a policy option, e.g. bytescheduler.credit_bytes=8MiB (repeatable; "
                          "'gradsched models' lists the options)")
    sim.add_argument("--gradient-budget", metavar="SIZE",
                     help="--arch sharded/fully_sharded: the gradients a rank holds before they are reduced "
                          "(gradient_budget_mb), e.g. 64MiB, or inf (default: the runtime's, twice the largest)")
    sim.add_argument("--gather-budget", metavar="SIZE",
                     help="--arch fully_sharded: whole parameters prefetching may hold (gather_budget_mb), e.g. "
                          "256MiB (default: the runtime's, the largest layer's)")
    sim.add_argument("--straggler", metavar="FACTOR[:link[:burst=SLOW/PERIOD]]",
                     help="one worker computes FACTOR times slower throughout (> 1): every collective waits for "
                          "its gradients, so the iteration runs on its compute, the plans made on its ready times; "
                          "FACTOR:link: its link is that much slower instead, which sets a ring's pace; "
                          "FACTOR:link:burst=200ms/400ms: its link that much slower for 200 ms of every 400 ms "
                          "by the clock")
    sim.add_argument("--iterations", type=int, default=30, help="simulated iterations (default 30)")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    sim.add_argument("--trace", help="write a Chrome trace (Perfetto, chrome://tracing) of every policy")
    sim.add_argument("--plot", help="write a PNG: timelines, or speed-up against bandwidth for a sweep")

    prof = sub.add_parser("profile", help="write a built-in model's table as a JSON profile",
                          description="Write the layer table of a built-in model (FLOP-count estimate) as JSON, "
                                      "to inspect, edit or replace with measured times.")
    _add_model_args(prof)
    prof.add_argument("--out", required=True, help="output JSON file")

    sub.add_parser("models", help="list models, devices, policies and their options")
    from .bench.cli import add_parser as add_bench
    from .tune.cli import add_parser as add_tune

    add_bench(sub)
    add_tune(sub, _add_setting_args)
    return parser


# -- helpers -------------------------------------------------------------------------------
def _table(args: argparse.Namespace) -> ModelTable:
    if getattr(args, "profile", None):
        if args.model:
            raise UsageError("use either --model or --profile, not both")
        table = ModelTable.load(args.profile)
    else:
        table = model_table(args.model or "resnet50", args.batch, args.device, args.classes, args.seq_len)
    return table.on_the_wire(2) if getattr(args, "compression", None) else table


def _policies(args: argparse.Namespace) -> list[PolicyConfig]:
    names = split_list(args.policy, "--policy")
    for name in names:
        if name not in POLICIES:
            raise UsageError(f"unknown policy {name!r}; choose from: {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise UsageError(f"policy listed twice in {args.policy!r}")
    overrides: dict[str, dict[str, str]] = {}
    for policy, option, value in parse_sets(args.set, names):
        overrides.setdefault(policy, {})[option] = value
    return [policy_config(name, **overrides.get(name, {})) for name in names]


def _clusters(args: argparse.Namespace) -> list[Cluster]:
    rates = bandwidths(args.bandwidth, args.sweep_bandwidth, "10Gbit")
    latency = parse_duration(args.latency)
    arch = kind(args.arch)
    if args.servers and not arch.servers:
        raise UsageError("--servers needs --arch ps")
    cast = _cast_cost(args)
    return [Cluster(args.workers, b, latency, args.arch, args.servers, cast_s_per_byte=cast) for b in rates]


def _sim_straggler(text: str) -> tuple[float, bool, tuple[float, float] | None]:
    """``simulate --straggler``: (factor, whether its link rather than its compute, and a link's
    bursts as (slow, period) seconds or None)."""
    usage = ("--straggler must be FACTOR, FACTOR:link or FACTOR:link:burst=SLOW/PERIOD, such as 1.5, 1.5:link or "
             f"2:link:burst=200ms/400ms, got {text!r}")
    factor, *what = text.split(":")
    try:
        value = float(factor)
    except ValueError:
        raise UsageError(usage) from None
    burst = what[1].removeprefix("burst=") if len(what) == 2 and what[1].startswith("burst=") else None
    if what not in ([], ["link"]) and (burst is None or what[0] != "link" or burst.count("/") != 1):
        raise UsageError(usage)
    if not value > 1:
        raise UsageError(f"--straggler must be a factor > 1 (one worker that many times slower), got {value:g}")
    if burst is None:
        return value, bool(what), None
    try:
        slow, period = (parse_duration(part) for part in burst.split("/"))
    except ValueError as exc:
        raise UsageError(f"--straggler's burst=SLOW/PERIOD are durations, such as 200ms/400ms: {exc}") from None
    if not 0 < slow < period:
        raise UsageError(f"--straggler's burst=SLOW/PERIOD needs 0 < SLOW < PERIOD, got {burst!r}")
    return value, True, (slow, period)


def _budgets(args: argparse.Namespace, cluster: Cluster) -> dict:
    """The sharded architectures' budgets given (``simulate``'s keywords)."""
    budgets: dict = {}
    if args.gradient_budget is not None:
        if not cluster.kind.phases:
            raise UsageError("--gradient-budget needs --arch sharded or fully_sharded")
        budgets["hold_bytes"] = None if args.gradient_budget.strip().lower() == "inf" else _size(args.gradient_budget,
                                                                                                 "--gradient-budget")
    if args.gather_budget is not None:
        if not cluster.kind.gathers:
            raise UsageError("--gather-budget needs --arch fully_sharded")
        budgets["gather_budget_bytes"] = _size(args.gather_budget, "--gather-budget")
    return budgets


def _size(text: str, flag: str) -> int:
    try:
        size = parse_bytes(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if size < 1:
        raise UsageError(f"{flag} must be at least 1 byte, got {text!r}")
    return size


def _cast_cost(args: argparse.Namespace) -> float:
    """Seconds per wire byte of each of compression's casts (0 without compression)."""
    if args.cast_cost is not None and not args.compression:
        raise UsageError("--cast-cost needs --compression")
    if not args.compression:
        return 0.0
    if args.cast_cost is not None:
        return parse_duration(args.cast_cost)
    return get_device(args.device).cast_s_per_byte


def _writable(path: str | None, flag: str) -> None:
    problem = problem_writing(path) if path else None
    if problem:
        raise UsageError(f"{flag} {path}: {problem}")


# -- commands ------------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace) -> int:
    configs = _policies(args)
    clusters = _clusters(args)
    if args.trace and len(clusters) > 1:
        raise UsageError("--trace needs a single bandwidth; drop --sweep-bandwidth or --trace")
    _writable(args.trace, "--trace")
    _writable(args.plot, "--plot")
    table = _table(args)
    if args.straggler is not None:
        factor, link, burst = _sim_straggler(args.straggler)
        if link:
            if kind(args.arch).servers:
                raise UsageError("--straggler FACTOR:link is modelled for rings (all-reduce, sharded), not --arch ps")
            pairs = [slow_link(table, cluster, factor) if burst is None else link_bursts(table, cluster, factor, *burst)
                     for cluster in clusters]
            table, clusters = pairs[0][0], [cluster for _, cluster in pairs]
        else:
            table = straggling(table, factor)
    timelines = bool(args.trace or (args.plot and len(clusters) == 1))
    if args.plot:
        require("matplotlib", "plot")  # now, not after the simulations
    with Progress("simulating", len(clusters) * len(configs), lines=False) as show:
        rows = compare(table, clusters, configs, args.iterations, record=timelines,
                       progress=None if args.json else show, **_budgets(args, clusters[0]))
    if args.json:
        print(json.dumps(rows_json(table, rows, args.iterations)))
    else:
        print(rows_text(table, rows), end="")
    results = [row.result for row in rows]
    if args.trace:
        from .sim.chrome import sim_trace

        sim_trace(results).save(args.trace)
        if not args.json:
            print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if args.plot:
        from . import plot

        if len(clusters) == 1:
            plot.plot_timelines(results, args.plot)
        else:
            plot.plot_sweep(rows, args.plot, f"{table.name} · {clusters[0].workers} workers · {clusters[0].arch}")
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    _writable(args.out, "--out")
    table = _table(args)
    table.save(args.out)
    print(f"{table.name}: {len(table.layers)} layers, {table.num_params} parameters, "
          f"{table.compute_s * 1e3:.1f} ms compute per iteration -> {args.out}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    print("models:")
    for info in MODELS.values():
        print(f"  {info.name:<12} {info.description}")
    print("devices (assumed sustained rates):")
    for d in DEVICES.values():
        print(f"  {d.name:<12} {d.tflops:g} TFLOP/s, {d.memory_gbs:g} GB/s, {d.launch_s * 1e6:g} us per layer: {d.note}")
    print("policies and options (--set POLICY.OPTION=VALUE):")
    for name, cls in POLICIES.items():
        options = ", ".join(f"{k}={v}" for k, v in cls().as_dict().items() if k != "policy")
        print(f"  {name:<14} {options}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "bench":
            from .bench.cli import cmd_bench

            return cmd_bench(args)
        if args.command == "tune":
            from .tune.cli import cmd_tune

            return cmd_tune(args, _table, lambda a: _clusters(
                argparse.Namespace(**{**vars(a), "sweep_bandwidth": None}))[0])
        handler = {"simulate": cmd_simulate, "profile": cmd_profile, "models": cmd_models}[args.command]
        return handler(args)
    except (UsageError, ValueError, RuntimeError, TimeoutError, ImportError) as exc:
        print(f"gradsched: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
