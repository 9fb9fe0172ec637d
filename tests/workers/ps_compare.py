"""Worker or server: train with parameter servers (the last SERVERS ranks) and, on the
workers, with DDP over the workers only; report differences.

    python -m workers.ps_compare OUT.json --servers S [--policies ...] [--optimizers ...] [--delays] [--compression C]

With --compression, the reference is DDP with the matching compression hook, and each case
also reports its mean distance from uncompressed DDP ("mean_error"), with DDP + hook's
("ddp_mean_error").
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradsched.runtime.comm.compression import WIRE, ddp_hook
from workers.launch import finish
from workers.train_compare import against, batches, make_optimizer, seeded_reference, train, wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--servers", type=int, required=True)
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--delays", action="store_true")
    parser.add_argument("--compression", choices=sorted(WIRE))
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = list(range(world - args.servers))
    worker_group = dist.new_group(workers)  # every rank creates it
    is_worker = rank in workers
    data = batches(rank, args.steps)
    report = {}

    def ddp_run(kind: str, compression: str | None):
        reference, initial = seeded_reference()
        if is_worker:
            opt, sched = make_optimizer(kind, reference)
            ddp = DDP(reference, process_group=worker_group)
            if compression:
                ddp.register_comm_hook(worker_group, ddp_hook(WIRE[compression]))
            train(ddp, opt, sched, data)
        return reference, initial

    def mean_distance(a, b) -> float:
        return torch.cat([(x.detach() - y.detach()).abs().reshape(-1) for x, y in zip(a, b)]).mean().item()

    for kind in args.optimizers.split(","):
        reference, initial = ddp_run(kind, args.compression)
        plain = ddp_run(kind, None)[0] if args.compression else reference
        for policy in args.policies.split(","):
            model, opt = wrapped(policy, kind, rank, args.delays, len(report), architecture="ps",
                                 servers=args.servers, fallback=False,
                                 compression=args.compression)
            if opt is None:  # a server: it served this run until the workers closed
                continue
            train(model, opt, None, data)
            opt.synchronize()
            stats = opt.stats
            report[f"{policy}/{kind}"] = {**against(model, reference, initial), "rounds": stats.rounds,
                                          "plans_adopted": stats.plans_adopted, "plan_policy": stats.plan_policy,
                                          "mean_error": mean_distance(model.parameters(), plain.parameters()),
                                          "ddp_mean_error": mean_distance(reference.parameters(), plain.parameters())}
            opt.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": gathered[: len(workers)]}, f)
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
