"""Worker: the contract every architecture keeps, scenario by scenario, for each policy, against
PyTorch's DDP (with the same optimizer, scheduler, hook) trained in the same processes.

    python -m workers.architectures OUT --arch A --policies P,... [--scenarios S,...]

``A`` is ``allreduce``, ``ps`` (the last rank a parameter server: 3 ranks), ``sharded`` or
``reducer`` (all-reduce whose measured trial keeps the buckets, so DDP's reducer takes over
after the first rounds: every scenario then runs past the hand-off). Two workers train; DDP's
reference trains on the workers' group. Each rank writes OUT.rank{r}.json: for every
``policy/scenario``, the largest difference from DDP's parameters (``diff``), or the error it
raised (``error``), the hand-off's round (``handed_off``) and the data plane's threads still
alive at the end of a run that handed off (``plane_threads``: none, the plane retired).

Scenarios:
  steps      AdamW with two parameter groups and StepLR, a LayerNorm in the model
  closure    optimizer.step(closure), every step
  no_sync    two backward passes per step, the first under no_sync()
  grad_sync  gradsched.DistributedDataParallel with require_backward_grad_sync=False for the
             first of two backward passes (as DDP's own)
  clip       clip_grad_norm_ and clip_grad_value_ through the optimizer (gradsched's)
  uneven     join(): rank 1 has two batches more
  hook       DDP's allreduce_hook as a communication hook
  compress   compression="bf16" against DDP with the bf16 hook
  checkpoint model and full optimizer state saved half-way, loaded into a fresh model and
             optimizer wrapped again, training resumed
"""

from __future__ import annotations

import argparse
import json
import threading
import traceback
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gradsched.runtime.comm.compression import ddp_hook
from workers.launch import finish

PLANE_THREADS = {"gradsched-launcher", "gradsched-completion", "gradsched-completion-end"}
SCENARIOS = ("steps", "closure", "no_sync", "grad_sync", "clip", "uneven", "hook", "compress", "checkpoint")
STEPS = 6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.norm, self.mid, self.head = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.mid(torch.relu(self.norm(self.inp(x))))))


def fresh() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def optimizer_for(model: nn.Module):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=0.02)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def batch(step: int, rank: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)


def loss_of(model, step: int, rank: int, micro: int = 0):
    x, y = batch(step, rank, micro)
    return nn.functional.cross_entropy(model(x), y)


def final(model) -> dict:
    module = getattr(model, "module", model)
    return {n: p.detach().clone() for n, p in module.named_parameters()}


class Run:
    """One policy under one architecture: each scenario trained under torch's DDP (on the
    workers) and under gradsched (every rank: a server serves inside wrap)."""

    def __init__(self, arch: str, policy: str, workers: dist.ProcessGroup | None, rank: int) -> None:
        self.arch, self.policy, self.workers, self.rank = arch, policy, workers, rank
        self.steps = 12 if arch == "reducer" else STEPS  # the reducer's: past the hand-off (after round 8)
        self.handed_off = None
        self.plane_threads: list[str] = []  # the data plane's threads alive after a hand-off

    def options(self, **extra) -> dict:
        base = dict(profile_rounds=1, replan_every=0, trial_rounds=3, trial_pairs=1, fallback=False, timeout=60.0)
        if self.arch == "ps":
            base.update(architecture="ps", servers=1)
        elif self.arch in ("sharded", "fully_sharded"):
            base.update(architecture=self.arch)
        elif self.arch == "reducer":  # the trial keeps the buckets: DDP's reducer from then on
            base.update(fallback=True, fallback_gain=0.99)
        return {**base, **extra}

    def reference(self, model: nn.Module, hook=None) -> TorchDDP:
        ddp = TorchDDP(model, process_group=self.workers)
        if hook is not None:
            ddp.register_comm_hook(self.workers, hook)
        return ddp

    def close(self, scheduled) -> None:
        self.handed_off = scheduled.stats.handed_off_round or self.handed_off
        if scheduled.stats.handed_off_round is not None:  # the plane retired: its threads stopped
            self.plane_threads += [t.name for t in threading.enumerate() if t.name in PLANE_THREADS]
        scheduled.close()


def side(run: Run, ours: bool, *, steps: range | None = None, hook=None, compression=None, start=None,
         resume: bool = False, **how) -> dict | None:
    """Train one side of a scenario; its final parameters (None on a server rank)."""
    model = fresh()
    opt, sched = optimizer_for(model)
    if start is not None:  # a checkpoint: model, optimizer and scheduler as saved
        model.load_state_dict(start["model"])
        opt.load_state_dict(start["optimizer"])
        sched.load_state_dict(start["scheduler"])
    if ours:
        options = run.options(**({"compression": compression} if compression else {}),
                              **({"broadcast_parameters": True} if resume else {}))
        model, opt = gradsched.wrap(model, opt, run.policy, comm_hook=(None, hook) if hook else None, **options)
        if opt is None:
            return None
    else:
        model = run.reference(model, hook or (ddp_hook(torch.bfloat16) if compression else None))
    if compression and run.arch == "sharded" and not ours:  # sharding steps fp32 masters, computes in bf16
        how["rounded"] = torch.bfloat16
    try:
        train(run, model, opt, sched, steps or range(run.steps), ours, **how)
        if ours:
            opt.synchronize()
    finally:
        if ours:
            run.close(opt)
    return final(model)  # after close(): fully sharded leaves every parameter whole then


def train(run: Run, model, opt, sched, steps: range, ours: bool, accumulate=False, closure=False, clip=False,
          uneven=False, rounded: torch.dtype | None = None) -> None:
    """``rounded`` (the reference of a compressed sharded run): the optimizer steps masters, the
    forward passes after a step compute with them rounded to that dtype, as sharding does."""
    masters = None
    joining = (opt if ours else model).join() if uneven else nullcontext()
    with joining:
        for step in steps:
            for s in [step] + ([1000 + step] if uneven and run.rank == 1 and step < 2 else []):
                if closure:
                    def closure_fn(s=s):
                        opt.zero_grad()
                        loss = loss_of(model, s, run.rank)
                        loss.backward()
                        return loss

                    opt.step(closure_fn)
                    continue
                opt.zero_grad()
                if accumulate:
                    with (opt if ours else model).no_sync():
                        loss_of(model, s, run.rank, micro=1).backward()
                loss_of(model, s, run.rank).backward()
                if clip:
                    clip_both(model, opt, ours)
                if masters is not None:
                    with torch.no_grad():
                        for p, master in zip(model.parameters(), masters):
                            p.copy_(master)
                opt.step()
                if rounded is not None:
                    masters = [p.detach().clone() for p in model.parameters()]
                    with torch.no_grad():
                        for p in model.parameters():
                            p.copy_(p.to(rounded))
            sched.step()


def clip_both(model, opt, ours: bool) -> None:
    if ours:
        opt.clip_grad_norm_(0.5)
        opt.clip_grad_value_(0.05)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)


def grad_sync_side(run: Run, ours: bool) -> dict | None:
    """gradsched.DistributedDataParallel as DDP: the first of two backward passes with
    require_backward_grad_sync=False, the optimizer built after the wrapper."""
    model = fresh()
    if ours:
        model = gradsched.DistributedDataParallel(model, policy=run.policy, **run.options())
    else:
        model = run.reference(model)
    opt, sched = optimizer_for(model.module)
    try:
        for step in range(run.steps):
            opt.zero_grad()
            model.require_backward_grad_sync = False
            loss_of(model, step, run.rank, micro=1).backward()
            model.require_backward_grad_sync = True
            loss_of(model, step, run.rank).backward()
            opt.step()
            sched.step()
        if ours:
            model.synchronize()
    finally:
        if ours:
            run.handed_off = model.stats.handed_off_round or run.handed_off
            if model.stats.handed_off_round is not None:
                run.plane_threads += [t.name for t in threading.enumerate() if t.name in PLANE_THREADS]
            model.close()
    return final(model)


def checkpoint_side(run: Run, ours: bool) -> dict | None:
    """Saved two steps before the end (the reducer's: after the hand-off), resumed in a fresh
    model and optimizer wrapped again; DDP's side trains without a break."""
    if not ours:
        return side(run, False)
    half = run.steps - 2
    model = fresh()
    opt, sched = optimizer_for(model)
    model, opt = gradsched.wrap(model, opt, run.policy, **run.options())
    if opt is None:  # a server: serves both runs (its parameters are rank 0's on the second: broadcast)
        model = fresh()
        gradsched.wrap(model, optimizer_for(model)[0], run.policy, **run.options(broadcast_parameters=True))
        return None
    try:
        train(run, model, opt, sched, range(half), True)
        # fully sharded: each parameter this rank's shard (a DTensor), joined on every rank
        saved = {"model": {k: v.full_tensor() if isinstance(v, DTensor) else v.clone()
                           for k, v in model.state_dict().items()}, "optimizer": opt.full_state_dict(rank0_only=False),
                 "scheduler": sched.state_dict()}
    finally:
        run.close(opt)
    return side(run, True, steps=range(half, run.steps), start=saved, resume=True)


def scenario(run: Run, name: str, ours: bool) -> dict | None:
    if name == "grad_sync":
        return grad_sync_side(run, ours)
    if name == "checkpoint":
        return checkpoint_side(run, ours)
    how = {"steps": {}, "closure": {"closure": True}, "no_sync": {"accumulate": True}, "clip": {"clip": True},
           "uneven": {"uneven": True}, "hook": {"hook": default_hooks.allreduce_hook},
           "compress": {"compression": "bf16"}}[name]
    return side(run, ours, **how)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--arch", required=True, choices=["allreduce", "ps", "sharded", "fully_sharded", "reducer"])
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workers = 2
    group = dist.new_group(list(range(workers)))  # every rank creates it; the reference trains on it
    report = {}
    for policy in args.policies.split(","):
        run = Run(args.arch, policy, group if rank < workers else None, rank)
        for name in args.scenarios.split(","):
            entry = {"diff": None, "error": None}
            try:
                reference = scenario(run, name, False) if rank < workers else None
                ours = scenario(run, name, True)
                if ours is not None:
                    entry["diff"] = max(float((ours[n] - reference[n]).abs().nan_to_num(float("inf")).max()) for n in reference)
            except Exception as exc:  # noqa: BLE001 - a refusal, or a failure: reported
                entry["error"] = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, gradsched.GradschedError):
                    traceback.print_exc()
            entry["handed_off"], run.handed_off = run.handed_off, None
            entry["plane_threads"], run.plane_threads = run.plane_threads, []
            report[f"{policy}/{name}"] = entry
            dist.barrier()  # every rank, the server too, finished the scenario
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
