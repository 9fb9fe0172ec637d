"""The runtime's overhead against DDP on loopback (no bandwidth limit), real processes.

    python benchmarks/runtime_overhead.py [--ranks 2] [--iters 40] [--repeats 3] [--width 1024] [--depth 6]
                                          [--compile] [--json FILE]
    python benchmarks/runtime_overhead.py --table FILE    # the table again, from a --json file

Starts the ranks itself (gloo over 127.0.0.1, one thread each). Every rank trains the same
MLP with DDP and with each policy, in rounds: each round runs two iterations of each, one
after the other, so that drift hits all alike; each repeat is a fresh set of processes.
Single iterations on a 2-core machine vary by tens of per cent, so the comparison is
paired: each round gives a ratio (a policy's median over its two iterations / DDP's in the
same round), and the figure is the median of these ratios over every round of every
repeat, with their interquartile range. Also printed: the median iteration time, and the
plan each policy ended up using (after its measured trial against DDP-style buckets; kept
buckets are handed to DDP's own reducer, "DDP's reducer", unless --no-handoff).
Loopback has no bandwidth limit, so this measures cost, not scheduling gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from gradsched.bench.processes import local_ranks, script_args, script_result, script_settings

POLICIES = ["fifo", "priority", "bytescheduler", "prophet"]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradsched

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    def make():
        torch.manual_seed(0)
        layers = [nn.Linear(256, args.width), nn.ReLU()]
        for _ in range(args.depth - 2):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        layers.append(nn.Linear(args.width, 10))
        return nn.Sequential(*layers)

    x = torch.randn(args.batch, 256)
    y = torch.randint(0, 10, (args.batch,))
    times: dict[str, list[float]] = {name: [] for name in ["ddp", *POLICIES]}
    runners = {}
    for name in times:
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if name == "ddp":
            model = DDP(model)
        else:
            model, opt = gradsched.wrap(model, opt, name, handoff=not args.no_handoff)
        runners[name] = (torch.compile(model) if args.compile else model, opt)

    def iteration(model, opt):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for name, (model, opt) in runners.items():  # gradsched's: past profiling and the measured trial
        for _ in range(args.warmup if name == "ddp" else max(args.warmup, opt.stats.settled_round + 1)):
            iteration(model, opt)
    block = 2
    for _ in range(0, args.iters, block):
        for name, (model, opt) in runners.items():
            dist.barrier()
            block_times = []
            for _ in range(block):
                t0 = time.perf_counter()
                iteration(model, opt)
                block_times.append(time.perf_counter() - t0)
            times[name].append(statistics.median(block_times))
    stats = {}
    for name, (model, opt) in runners.items():
        if name != "ddp":
            stats[name] = opt.stats.as_dict()
            opt.close()
    if rank == 0:
        print(json.dumps({"rounds": times, "stats": stats}))
    dist.destroy_process_group()


def launch(args: argparse.Namespace) -> dict:
    return local_ranks([__file__, "--worker", *sys.argv[1:]], args.ranks)


def summary(runs: list[dict]) -> dict:
    """Per policy: the median iteration time over every round, and the median and quartiles
    of its per-round ratios to DDP."""
    out = {}
    for name in runs[0]["rounds"]:
        ratios = [p / d for run in runs for p, d in zip(run["rounds"][name], run["rounds"]["ddp"])]
        q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        out[name] = {"iteration_s": statistics.median(t for run in runs for t in run["rounds"][name]),
                     "ratio_to_ddp": median, "ratio_q1": q1, "ratio_q3": q3, "rounds": len(ratios)}
    return out


def table(data: dict) -> str:
    args, figures, stats = data["args"], data["summary"], data["runs"][-1]["stats"]
    params = (256 * args["width"] + args["width"]) + (args["depth"] - 2) * (args["width"] ** 2 + args["width"]) \
        + args["width"] * 10 + 10
    compiled = ", every model torch.compile'd" if args.get("compile") else ""
    lines = [f"{args['ranks']} ranks, loopback, MLP {params / 1e6:.1f}M parameters, batch {args['batch']}, "
             f"{args['repeats']} runs x {args['iters'] // 2} rounds{compiled}",
             f"  {'':14s} {'iter ms':>8s} {'vs ddp':>7s} {'(quartiles)':>15s}  plan in use (trial ms: policy / fifo; predicted)"]
    for name, f in figures.items():
        note = ""
        if name in stats:
            trial, pred = stats[name].get("trial"), stats[name].get("prediction")
            measured = f" ({trial['policy_s'] * 1e3:.1f} / {trial['fifo_s'] * 1e3:.1f}" if trial else " (-"
            guess = f"; {pred['policy_s'] * 1e3:.1f} / {pred['fifo_s'] * 1e3:.1f})" if pred else ")"
            handed = " (DDP's reducer)" if stats[name].get("handed_off_round") else ""
            note = f"  {stats[name]['plan_policy']}{handed}{measured}{guess}"
        spread = f"({f['ratio_q1']:.3f}-{f['ratio_q3']:.3f})"
        lines.append(f"  {name:14s} {f['iteration_s'] * 1e3:8.2f} {f['ratio_to_ddp']:6.3f}x {spread:>15s}{note}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=16)  # gradsched's: at least past the measured trial
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="torch.compile every model (after DDP / the wrap)")
    parser.add_argument("--no-handoff", action="store_true", help="keep gradsched's own buckets where the trial keeps them")
    args = script_args(parser, worker, table)
    if args is None:
        return
    if args.iters < 4 or args.repeats < 1:
        parser.error("--iters must be >= 4 (two rounds) and --repeats >= 1")
    runs = []
    for repeat in range(args.repeats):
        runs.append(launch(args))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    script_result(args, {"args": script_settings(args), "summary": summary(runs), "runs": runs}, table)


if __name__ == "__main__":
    main()
