"""Uneven inputs: worker rank r trains on STEPS + EXTRA * r steps, inside join() (or not).

    python -m workers.uneven OUT --impl ddp|gradsched|wrap [--policy P] [--workers-only] [--divide-by-active]
        [--find-unused] [--accumulate K] [--servers S] [--throw] [--no-join [--then exit|barrier]]

``ddp`` is PyTorch's DDP with ``model.join()``, the reference; ``gradsched`` is
gradsched.DistributedDataParallel with ``model.join()``; ``wrap`` is gradsched.wrap with
``optimizer.join()`` (or ``Join([optimizer])`` with --generic). Control points come every few
backward passes, so plans change while some ranks shadow the others. Every worker writes its
parameters and buffers at the end to OUT.rank{r}.pt, and the number of shadowed iterations
and what it raised (if anything) to OUT.rank{r}.json.
"""

import argparse
import json
import traceback
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join

from workers.launch import finish


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.fc1 = nn.Linear(6 * 6 * 6, 32)
        self.side = nn.Linear(32, 32)  # used in some iterations only (with --find-unused)
        self.head = nn.Linear(32, 10)

    def forward(self, x, use_side=True):
        x = torch.relu(self.fc1(torch.relu(self.bn(self.conv(x))).flatten(1)))
        if use_side:
            x = torch.relu(self.side(x))
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--impl", choices=["ddp", "gradsched", "wrap"], required=True)
    parser.add_argument("--policy", default="bytescheduler")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--extra", type=int, default=3)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--divide-by-active", action="store_true")
    parser.add_argument("--find-unused", action="store_true")
    parser.add_argument("--servers", type=int, default=0)
    parser.add_argument("--generic", action="store_true", help="Join([...]) instead of .join()")
    parser.add_argument("--throw", action="store_true", help="throw_on_early_termination")
    parser.add_argument("--no-join", action="store_true")
    parser.add_argument("--then", choices=["exit", "barrier"], default="barrier")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--misuse", choices=["eval", "nostep"], help="what the last rank does once the others joined: "
                        "eval (refused inside join()), nostep (allowed, as with DDP)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    optimizer = None
    options = dict(profile_rounds=2, replan_every=2, trial_rounds=3, find_unused_parameters=args.find_unused,
                   timeout=args.timeout)
    if args.servers:
        options.update(architecture="ps", servers=args.servers)
    if args.impl == "ddp":
        model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=args.find_unused)
    elif args.impl == "gradsched":
        import gradsched

        model = gradsched.DistributedDataParallel(model, policy=args.policy, **options)
    if args.impl != "wrap":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        joinable, no_sync = model, model.no_sync
    else:
        import gradsched

        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = gradsched.wrap(model, optimizer, args.policy, **options)
        if optimizer is None:  # a parameter server: it served until the workers closed their optimizers
            dist.destroy_process_group()
            finish()
        joinable, no_sync = optimizer, optimizer.no_sync

    steps = args.steps + args.extra * rank
    g = torch.Generator().manual_seed(100 + rank)
    data = [[(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))
             for _ in range(args.accumulate)] for _ in range(steps)]
    join_options = dict(divide_by_initial_world_size=not args.divide_by_active, throw_on_early_termination=args.throw)
    if args.no_join:
        context = nullcontext()
    elif args.generic:
        context = Join([joinable], throw_on_early_termination=args.throw,
                       divide_by_initial_world_size=not args.divide_by_active)
    else:
        context = joinable.join(**join_options)
    report = {"steps": steps, "error": None}
    try:
        with context:
            for step, batches in enumerate(data):
                for k, (x, y) in enumerate(batches):
                    with no_sync() if k < args.accumulate - 1 else nullcontext():
                        use_side = not args.find_unused or (step + rank) % 3 != 0
                        loss = nn.functional.cross_entropy(model(x, use_side=use_side), y) / args.accumulate
                        loss.backward()
                late = step >= args.steps and rank == dist.get_world_size() - args.servers - 1
                if not (late and args.misuse == "nostep"):
                    optimizer.step()
                optimizer.zero_grad()
                if late and args.misuse == "eval":
                    model(x)  # with gradients enabled, and no backward
    except RuntimeError as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    if report["error"] is None:
        module = model.module if args.impl != "wrap" else model
        state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        torch.save(state, f"{args.out}.rank{rank}.pt")
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(report, f)
    if args.no_join and args.then == "exit" and report["error"] is None:
        return  # the script ends, as a user's does: gradsched closes at exit
    if args.no_join and report["error"] is not None:
        _wait_for_the_other_failures(dist.get_world_size() - 1)
    if report["error"] is None:
        if args.impl != "ddp" and not args.no_join:
            (optimizer if args.impl == "wrap" else model).close()  # parameter servers end with it
        if not args.servers:
            dist.barrier()
    finish()


def _wait_for_the_other_failures(failing: int) -> None:
    """Leave only once every rank still training has failed (and so has asked the others how
    far they got): the first to leave would otherwise break the short rank's barrier, and that
    rank would report itself closed to the others still asking."""
    import time

    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    store.add("uneven/failed", 1)
    deadline = time.monotonic() + 30.0
    while store.add("uneven/failed", 0) < failing and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
