"""``gradsched tune``: tune a policy's options against the simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING

import argparse
import json

from ..cli_args import UsageError
from ..units import format_bytes
from ..progress import Progress

if TYPE_CHECKING:  # pragma: no cover
    from .offline import TuneResult
from .space import DEFAULT_RANGES, SAMPLERS, default_space


def add_parser(sub, add_setting_args) -> None:
    tune = sub.add_parser(
        "tune", help="tune a policy's partition and credit sizes against the simulator",
        description="Bayesian optimisation (Optuna) of a policy's options on log scales, each trial one "
                    "simulation of the setting; the policy's defaults are the first trial.")
    add_setting_args(tune)  # the model and cluster options of gradsched simulate
    tune.add_argument("--policy", default="bytescheduler", help=f"one of: {', '.join(DEFAULT_RANGES)} "
                                                                "(default bytescheduler)")
    tune.add_argument("--trials", type=int, default=15, help="simulations, the default options first (default 15)")
    tune.add_argument("--seed", type=int, default=0, help="sampler seed: equal seeds give equal results (default 0)")
    tune.add_argument("--sampler", default="gp", choices=SAMPLERS, help="Optuna sampler (default gp)")
    tune.add_argument("--space", action="append", default=[], metavar="OPTION=LOW:HIGH",
                      help="search range of an option, e.g. partition_bytes=256KiB:8MiB (repeatable)")
    tune.add_argument("--json", action="store_true", help="print one JSON object")


def _describe(options: dict) -> str:
    return " ".join(f"{k}={format_bytes(v) if k.endswith('_bytes') else f'{v:.3g}'}" for k, v in options.items())


def result_text(title: str, result: TuneResult) -> str:
    best, default = result.best, result.default
    lines = [title, f"  bound {result.bound_s * 1e3:.1f} ms",
             f"  default  {default['iteration_s'] * 1e3:9.2f} ms  {default['iteration_s'] / result.bound_s:.3f}x bound"
             f"  {_describe(default['options'])}",
             f"  best     {best['iteration_s'] * 1e3:9.2f} ms  {best['iteration_s'] / result.bound_s:.3f}x bound"
             f"  {_describe(best['options'])}  (trial {best['trial']}, "
             f"{default['iteration_s'] / best['iteration_s']:.3f}x the default)",
             "  history:"]
    for h in result.history:
        mark = " default" if h["default"] else ""
        lines.append(f"    {h['trial']:>3}  {h['iteration_s'] * 1e3:9.2f} ms  best {h['best_s'] * 1e3:9.2f} ms  "
                     f"{_describe(h['options'])}{mark}")
    return "\n".join(lines) + "\n"


def cmd_tune(args: argparse.Namespace, table_of, cluster_of) -> int:
    overrides = {}
    for item in args.space:
        option, eq, bounds = item.partition("=")
        if not eq:
            raise UsageError(f"--space {item!r}: write OPTION=LOW:HIGH, e.g. partition_bytes=256KiB:8MiB")
        overrides[option.strip()] = bounds.strip()
    space = default_space(args.policy, overrides)
    if args.trials < 1:
        raise UsageError(f"--trials must be >= 1, got {args.trials}")
    cluster = cluster_of(args)
    table = table_of(args)
    from .offline import tune_offline  # loads Optuna (the tune extra)

    with Progress("tuning", args.trials, lines=False) as show:
        result = tune_offline(table, cluster, space, args.trials, args.seed, args.sampler,
                              None if args.json else lambda h: show(f"best {h['best_s'] * 1e3:.2f} ms"))
    if args.json:
        print(json.dumps({"model": table.name, "cluster": cluster.describe(), "policy": args.policy,
                          "trials": args.trials, "seed": args.seed, "sampler": args.sampler,
                          "bound_s": result.bound_s, "best": result.best, "default": result.default,
                          "history": result.history}))
    else:
        print(result_text(f"{table.name} · {cluster.describe()} · {args.policy}, {args.trials} trials "
                          f"({args.sampler}, seed {args.seed})", result), end="")
    return 0
