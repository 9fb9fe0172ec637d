"""How long a forward pass waits for DDP's buffer sync (BatchNorm statistics broadcast from rank 0),
under NCCL's semantics emulated on CPU, against how long a round takes.

    python benchmarks/buffer_broadcast.py [--iters 12] [--collective-ms 30] [--json FILE]
    python benchmarks/buffer_broadcast.py --table FILE    # the table again, from a --json FILE

Two gloo ranks on loopback, started here, train a convolution with BatchNorm followed by nine
linear layers with each policy (small partitions and a small credit window: a round is many
messages, few in flight at once), every collective taking ``--collective-ms`` on its emulated
stream (``GRADSCHED_EMULATE_NCCL=0,DURATION``). Printed per policy: the median iteration time
after the first rounds, and how much of each iteration the training thread spent blocked
waiting for the buffers (the first BatchNorm's forward pre-hook). With the broadcast issued only
after every message of the round before has been launched, a credit window makes the first
BatchNorm wait for the window to drain (issue 54's reading: 1,174 ms a round with bytescheduler,
376 of them blocked there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from gradsched.bench.processes import local_ranks, script_args, script_result

POLICIES = ("fifo", "bytescheduler", "prophet")
OPTIONS = {"fifo": {"bucket_cap_bytes": 8192, "first_bucket_bytes": 2048},
           "bytescheduler": {"partition_bytes": 4096, "credit_bytes": 8192},
           "prophet": {"partition_bytes": 4096, "credit_bytes": 8192, "fuse_bytes": 4096}}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import gradsched

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    results = {}
    for policy in POLICIES:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                              nn.Linear(8 * 6 * 6, 64), *[nn.Linear(64, 64) for _ in range(8)], nn.Linear(64, 10))
        model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01), policy,
                                    policy_options=OPTIONS[policy], fallback=False, handoff=False, profile_rounds=2)
        sync = opt._coordinator.backend.buffer_sync
        times, waits = [], []
        for _ in range(args.iters):
            started, waited = time.perf_counter(), sync.waited_s
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - started)
            waits.append(sync.waited_s - waited)
        messages = opt.stats.plan_messages
        opt.close()
        skip = min(4, args.iters // 2)  # the first plans, made from guesses
        results[policy] = {"iteration_s": statistics.median(times[skip:]), "blocked_s": statistics.median(waits[skip:]),
                           "messages": messages}
    if rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()


def launch(args: argparse.Namespace) -> dict:
    return local_ranks([__file__, "--worker", *sys.argv[1:]], 2,
                       {"GRADSCHED_EMULATE_NCCL": f"0,{args.collective_ms / 1000}"})


def table(data: dict) -> str:
    lines = [f"2 ranks, emulated NCCL, {data['args']['collective_ms']:g} ms per collective, "
             f"median of {data['args']['iters']} iterations after the first rounds",
             f"  {'':14s} {'iter ms':>8s} {'blocked ms':>11s} {'messages':>9s} {'link ms':>8s}"]
    for policy, f in data["results"].items():
        link = f["messages"] * data["args"]["collective_ms"]  # a round's collectives, one after another
        lines.append(f"  {policy:14s} {f['iteration_s'] * 1e3:8.0f} {f['blocked_s'] * 1e3:11.0f} {f['messages']:9d} "
                     f"{link:8.0f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--collective-ms", type=float, default=30.0)
    args = script_args(parser, worker, table)
    if args is None:
        return
    data = {"args": {"iters": args.iters, "collective_ms": args.collective_ms}, "results": launch(args)}
    script_result(args, data, table)


if __name__ == "__main__":
    main()
