"""``gradsched bench``: the command line of the emulated-cluster benchmark."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ..core.architectures import kind
from ..cli_args import UsageError, bandwidths, parse_sets, split_list
from ..extras import require
from ..files import problem_writing
from ..progress import Progress
from ..units import parse_duration
from .dilation import AUTO_CPU_SHARE
from .netns import JUMBO_MTU, available
from .config import BASELINES, BENCH_ARCHITECTURES, BenchConfig
from .report import settings_json, settings_text
from .runner import run_bench
from .straggler import Straggler
from .workloads import REAL, REPLAY

DEFAULT_POLICIES = "ddp,fifo,priority,bytescheduler,prophet"


def add_parser(sub) -> None:
    names = ", ".join([*REAL, *REPLAY])
    bench = sub.add_parser(
        "bench", help="DDP against every policy on an emulated bandwidth-limited cluster",
        description="Run real training processes in Linux network namespaces (one per rank, or per host of "
                    "--procs-per-node ranks), joined by a bridge, each "
                    "link limited with tc in both directions, and compare DDP with every policy against the "
                    "bound max(compute, communication). Needs root and iproute2; otherwise runs on loopback "
                    "without a limit (and says so).")
    bench.add_argument("--model", default="mlp", help=f"one of: {names} (default mlp)")
    bench.add_argument("--workers", type=int, help="training ranks (default 2, or --nodes x --procs-per-node)")
    bench.add_argument("--nodes", type=int, help="emulated hosts of training ranks (instead of --workers), each "
                                                 "started with its own torchrun --nnodes N --node-rank i")
    bench.add_argument("--procs-per-node", type=int, default=1,
                       help="ranks per emulated host, sharing its namespace and its link (default 1)")
    bench.add_argument("--arch", default="allreduce", choices=BENCH_ARCHITECTURES,
                       help="all-reduce (default) or parameter servers (ps: compared with the fifo policy)")
    bench.add_argument("--servers", type=int, default=0, help="parameter servers, each a rank of its own (--arch ps)")
    bench.add_argument("--bandwidth", help="link bandwidth per rank and direction, e.g. 5Gbit (default 5Gbit)")
    bench.add_argument("--sweep-bandwidth", help="comma list of bandwidths, bare numbers in Gbit/s: 1,2,5")
    bench.add_argument("--balance", action="store_true",
                       help="measure at this machine's balance point: the bandwidth where compute only and "
                            "communication only take equal time, found by short calibration runs starting from "
                            "--bandwidth")
    bench.add_argument("--dilation", default="1", metavar="K|auto",
                       help="time dilation: replayed compute K times slower, links at 1/K of the rate, latency K "
                            "times longer, every time reported divided by K; auto: the smallest K that keeps the "
                            f"host's CPUs under {AUTO_CPU_SHARE * 100:.0f}%% busy communicating only "
                            "(default 1: none; docs/bench.md)")
    bench.add_argument("--mtu", type=int, default=JUMBO_MTU,
                       help=f"frame size of the emulated links in bytes (default {JUMBO_MTU}: jumbo frames, "
                            "docs/bench.md)")
    bench.add_argument("--latency", default="0", help="added one-way latency per link, e.g. 1ms (default 0)")
    bench.add_argument("--own-plans", action="store_true",
                       help="with a straggler: rank 0 plans on its own ready times, not on the slow rank's (what "
                            "planning on the slow rank gains, measured apart; wrap(plan_on_slow_rank=False))")
    bench.add_argument("--straggler", metavar="RANK:FACTOR[:link][:burst=S/P]",
                       help="one slow worker: RANK's replayed compute FACTOR times slower throughout, e.g. 1:1.5 "
                            "(the bound and the predictions take the slow rank's compute, which every collective "
                            "waits for); :link slows its link instead (both directions); :burst=S/P slows its "
                            "compute in S of every P iterations (--iters a multiple of P), or its link for S of "
                            "every P seconds by the clock (durations: :link:burst=100ms/400ms, undilated); with "
                            "bursts the rows are means over the timed iterations")
    bench.add_argument("--policy", default=DEFAULT_POLICIES,
                       help=f"comma list of {', '.join(BASELINES)} and the policies (default {DEFAULT_POLICIES})")
    bench.add_argument("--iters", type=int, default=30, help="timed iterations per policy (default 30)")
    bench.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    bench.add_argument("--batch", type=int, default=32, help="batch of replay models' profiles (default 32)")
    bench.add_argument("--device", default="v100", help="device preset of replay models' profiles (default v100)")
    _add_variants(bench)
    bench.add_argument("--loopback", action="store_true", help="skip the emulated network: loopback, no limit")
    bench.add_argument("--timeout", default="30min", help="give up after this long per bandwidth (default 30min)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    bench.add_argument("--plot", help="write a PNG (speed-up and ratio to the bound against bandwidth)")
    bench.add_argument("--check", action="store_true",
                       help="only say whether the emulated cluster can run here (exit 0) or why not (exit 1)")
    bench.add_argument("--trace-dir", help="write each policy's Chrome traces (one per rank) into this folder")
    bench.add_argument("--timeline", metavar="PNG",
                       help="write one iteration of DDP (fifo with --arch ps) and of the fastest policy on a shared "
                            "time axis, from the runs' traces (of the last bandwidth measured)")


def _add_variants(bench) -> None:
    """What else runs beside each policy as it is: options changed, variants' rows."""
    bench.add_argument("--set", action="append", default=[], metavar="POLICY.OPTION=VALUE",
                       help="change a policy option, e.g. prophet.fuse_bytes=8MiB (repeatable)")
    bench.add_argument("--no-fallback", action="store_true",
                       help="keep each policy's own plans even where DDP-style buckets are predicted faster")
    bench.add_argument("--autotune", type=int, default=0, metavar="TRIALS",
                       help="also run each tunable policy tuned online with this many candidates ('+autotune' rows)")
    bench.add_argument("--compression", choices=["bf16", "fp16"],
                       help="gradsched's policies send gradients as bf16/fp16; compare with the ddp-bf16/ddp-fp16 "
                            "baselines (DDP with the matching compression hook)")
    bench.add_argument("--clip", type=float, default=0.0, metavar="MAX_NORM",
                       help="also run ddp and each policy clipping gradients to this global norm ('+clip' rows)")
    bench.add_argument("--sharded", action="store_true",
                       help="also run each policy with architecture='sharded' ('+sharded' rows: every rank owns 1/n "
                            "of the parameters and optimizer state)")
    bench.add_argument("--fully-sharded", action="store_true",
                       help="also run each policy with architecture='fully_sharded' ('+fully_sharded' rows: the "
                            "parameters too, gathered around each module's forward and backward pass; compare with "
                            "the fsdp2 and fsdp2-noreshard baselines)")


def config_from(args: argparse.Namespace) -> BenchConfig:
    if kind(args.arch).servers and args.policy == DEFAULT_POLICIES:
        args.policy = DEFAULT_POLICIES.replace("ddp,", "")
    rates = bandwidths(args.bandwidth, args.sweep_bandwidth, "5Gbit")
    policies = tuple(split_list(args.policy, "--policy"))
    if len(set(policies)) != len(policies):
        raise UsageError(f"policy listed twice in {args.policy!r}")
    if args.nodes is not None and args.workers is not None:
        raise UsageError("give --workers or --nodes (with --procs-per-node), not both")
    if args.nodes is not None and args.nodes < 1:
        raise UsageError(f"--nodes must be >= 1, got {args.nodes}")
    workers = args.nodes * args.procs_per_node if args.nodes is not None else (2 if args.workers is None else args.workers)
    return BenchConfig(
        model=args.model, workers=workers, procs_per_node=args.procs_per_node, bandwidths_bps=tuple(rates),
        launcher="torchrun" if args.nodes is not None else "direct",
        latency_s=parse_duration(args.latency), policies=policies, iters=args.iters, warmup=args.warmup,
        batch=args.batch, device=args.device, trace_dir=args.trace_dir, timeout_s=parse_duration(args.timeout),
        loopback=args.loopback, fallback=not args.no_fallback, options=tuple(parse_sets(args.set, policies)), arch=args.arch,
        servers=args.servers, autotune_trials=args.autotune, balance=args.balance, clip=args.clip, sharded=args.sharded,
        fully_sharded=args.fully_sharded,
        compression=args.compression, dilation=_dilation(args.dilation), mtu=args.mtu,
        straggler=None if args.straggler is None else _straggler(args.straggler), plan_on_slow_rank=not args.own_plans,
    )


def _straggler(text: str) -> Straggler:
    try:
        return Straggler.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _dilation(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--dilation must be a factor such as 3, or auto, got {text!r}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    if args.check:
        usable, why = available()
        print("the emulated cluster can run here" if usable else f"no emulated cluster here: {why}", file=sys.stderr)
        return 0 if usable else 1
    if args.timeline and not args.trace_dir:  # the picture is drawn from traces: keep them beside it
        args.trace_dir = os.path.splitext(args.timeline)[0] + "-traces"
    config = config_from(args)
    require("psutil", "bench")  # the workers report the host's CPU load
    for option, target in (("--plot", args.plot), ("--timeline", args.timeline)):
        if target:
            require("matplotlib", "plot")
            problem = problem_writing(target)
            if problem:  # checked now, not after a run of many minutes
                raise UsageError(f"{option} {target}: {problem}")
    if args.trace_dir and os.path.exists(args.trace_dir) and not os.path.isdir(args.trace_dir):
        raise UsageError(f"--trace-dir {args.trace_dir}: is a file; give a folder (created if missing)")
    # a plain `kill` must clean up the namespaces too: turn SIGTERM into an exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)

    def warn(line: str) -> None:
        print(f"gradsched: warning: {line}", file=sys.stderr, flush=True)

    total = None if config.balance or config.dilation == "auto" else config.phases * len(config.bandwidths_bps)
    with Progress("bench", total) as progress:
        settings = run_bench(config, progress=progress, warn=warn)
    if args.json:
        print(json.dumps(settings_json(config, settings)))
    else:
        print(settings_text(config, settings), end="")
    if args.plot:
        from ..plot import plot_bench

        plot_bench(settings_json(config, settings), args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    if args.timeline:
        from .timeline import draw_timeline

        drawn = draw_timeline(settings_json(config, settings), args.trace_dir, args.timeline)
        if not args.json:
            print(f"timeline of {' and '.join(drawn)} written to {args.timeline} (traces in {args.trace_dir})")
    return 0
