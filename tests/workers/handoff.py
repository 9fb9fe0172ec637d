"""Worker: a policy whose measured trial keeps DDP-style buckets (certain: it would have to be
99% faster) hands the gradients to DDP's own reducer at the same step on every rank, and
trains as DDP does, through both APIs, no_sync(), global-norm clipping, ``step(closure)`` and
BatchNorm buffers included, and an
epoch of uneven inputs under join() at the end (rank 0 has 3 more batches than rank 1:
DDP's own join, the joined rank shadowing with zeros). The hand-off waits for the gradients
to be let go: in the wrap API's loop, at its optimizer's ``zero_grad()``; in the DDP API's
(a plain torch optimizer), as the next forward pass begins; DDP's reducer then holds them
as views of its buckets.

    python -m workers.handoff OUT.json
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import tempfile
import threading
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish_with_report
from workers.train_compare import SMALL, Net, against, batches, seeded_reference

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")  # the trial's choice
STEPS = 24
ACCUMULATE = (18, 19)  # these steps add a no_sync() micro-batch before the one that communicates
CLIPPED = (20, 21)  # these clip by global norm (long after the hand-off): gradsched's clipping against torch's
CLOSURE = (22, 23)  # these step with a closure (Lightning's automatic optimization): forward and backward inside
OPTIONS = dict(policy="priority", policy_options=SMALL["priority"], profile_rounds=2, trial_rounds=3,
               fallback_gain=0.99, replan_every=0)


def uneven(rank: int) -> list:
    return batches(50 + rank, 4 if rank == 0 else 1)


def run(model, opt, data, no_sync, clip) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        if step in CLOSURE:
            opt.step(lambda: loss_fn(model(x), y).backward())
            continue
        if step in ACCUMULATE:
            with no_sync():
                loss_fn(model(x.flip(0)), y.flip(0)).backward()
        loss_fn(model(x), y).backward()
        if step in CLIPPED:
            clip(0.05)
        opt.step()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = batches(rank, STEPS)
    reference, initial = seeded_reference()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    ddp = DDP(reference)
    torch_clip = lambda norm: torch.nn.utils.clip_grad_norm_(ddp.parameters(), norm)  # noqa: E731
    run(ddp, ref_opt, data, ddp.no_sync, torch_clip)
    with ddp.join():
        run(ddp, ref_opt, uneven(rank), ddp.no_sync, torch_clip)
    report = {}
    for api in ("wrap", "DistributedDataParallel"):
        torch.manual_seed(0)
        net = Net()
        if api == "wrap":
            model, opt = gradsched.wrap(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), **OPTIONS)
            stats, no_sync, joinable, clip = (lambda: opt.stats), opt.no_sync, opt, opt.clip_grad_norm_
        else:
            model = gradsched.DistributedDataParallel(net, **OPTIONS)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            stats, no_sync, joinable, clip = (lambda: model.stats), model.no_sync, model, model.clip_grad_norm_
        co = opt._coordinator if api == "wrap" else model._binder.coordinator
        plane = co.backend  # gradsched's own, until the hand-off retires it whole
        retired = [weakref.ref(plane), weakref.ref(plane.exchange), weakref.ref(plane.planner)]
        launcher = plane.exchange.launcher._thread
        del plane
        run(model, opt, data, no_sync, clip)
        with joinable.join():
            run(model, opt, uneven(rank), no_sync, clip)
        gc.disable()  # freed at once (no cycle of the plane's left for the collector)
        alive = [r() is not None for r in retired]
        gc.enable()
        with tempfile.TemporaryDirectory() as where:  # what the plane measured, read from the run's record
            profiled = os.path.exists((opt if api == "wrap" else model).export_profile(os.path.join(where, "p.json")))
        s = stats()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        report[api] = {**against(net, reference, initial),
                       "grad_storages": len({g.untyped_storage().data_ptr() for g in grads}), "grads": len(grads), "handed_off_round": s.handed_off_round,
                       "settled_round": s.settled_round, "rounds": s.rounds, "plan_policy": s.plan_policy,
                       "trial": s.as_dict()["trial"], "class": type(net).__name__,
                       "retired_alive": alive, "launcher_alive": launcher.is_alive(), "profiled": profiled,
                       "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("gradsched"))}
        (opt if api == "wrap" else model).close()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, report)
    finish_with_report(sys.argv[1], everyone)


if __name__ == "__main__":
    main()
