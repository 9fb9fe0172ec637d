"""Worker: gradsched against DDP in the cases where NCCL's completion semantics matter, on 2
gloo ranks; run under ``GRADSCHED_EMULATE_NCCL`` (gradsched.runtime.device.emulated) a
collective's future completes when it is queued and the reduction runs later, so a read or
write not ordered after it gives wrong values here.

Every case trains the same model (BatchNorm, so buffers are broadcast before every forward
pass) from the same start on rank-specific data with DDP and with gradsched, and reports the
largest difference of parameters and buffers (and of every gradient read):

* ``plain``: a step per backward pass;
* ``no_sync``: two micro-batches per step, the first under ``no_sync()``;
* ``flag``: the same by ``require_backward_grad_sync`` (DDP's attribute; ``wrap``: ``no_sync()``);
* ``two_backward``: two backward passes that both communicate before one step;
* ``no_optimizer``: backward passes and reads of ``.grad`` only, two passes accumulated each time;
* ``unused``: ``find_unused_parameters=True``, two backward passes per step: a layer no rank
  uses and then every rank (zeros reduced for it, then its gradient), or rank 1 alone and then none;
* ``clip`` / ``clip_value``: torch's ``clip_grad_norm_`` / ``clip_grad_value_`` after backward;
* ``bf16``: ``compression="bf16"`` against DDP with the same compression as a hook;
* ``hook``: PyTorch's ``allreduce_hook`` registered on both;
* ``handoff`` / ``handoff_bf16``: the measured trial keeps the buckets (fallback_gain=0.99), the
  gradients go to DDP's reducer, and training goes on past it with ``step(closure)``; the
  bf16 one also reports whether compression's wire copies outlived the hand-off.

    python -m workers.nccl_semantics OUT.json --cases plain,no_sync --policies fifo,prophet --apis ddp,wrap --pause 0.03
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from gradsched.runtime.comm.compression import ddp_hook
from workers.launch import finish_with_report
from workers.train_compare import SMALL, batches

# Credit windows wider than the model: every message of a round is launched, and so resolved (on
# NCCL: queued) while the next forward pass runs, where a missing wait shows
OPTIONS = {"fifo": SMALL["fifo"], "priority": {"partition_bytes": 16384},  # one slice at a time: a few of them
           "bytescheduler": {"partition_bytes": 4096, "credit_bytes": 1 << 20},
           "prophet": {"partition_bytes": 4096, "credit_bytes": 1 << 20, "fuse_bytes": 2048, "profile_iterations": 2}}
CASES = ("plain", "no_sync", "flag", "two_backward", "no_optimizer", "unused", "clip", "clip_value", "bf16",
         "hook", "handoff", "handoff_bf16")
STEPS = {"handoff": 16, "handoff_bf16": 16}  # past the hand-off (about round 10); others 6
CLOSURE_FROM = 8  # handoff cases: step(closure) from this step on
PAUSE = [0.0]  # seconds after each backward pass (--pause)


class Net(nn.Module):
    def __init__(self, aux: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 6 * 6, 48)
        self.fc2 = nn.Linear(48, 48)
        self.head = nn.Linear(48, 10)
        self.aux = nn.Linear(48, 48) if aux else None  # (unused) only rank 1's forward uses it
        self.use_aux = False

    def forward(self, x):
        x = torch.relu(self.fc2(torch.relu(self.fc1(torch.relu(self.bn(self.conv(x))).flatten(1)))))
        return self.head(self.aux(x) if self.use_aux else x)


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of floating-point entries (BatchNorm's batch counter left out)."""
    return max((a[n].double() - b[n].double()).abs().nan_to_num(float("inf")).max().item() for n in b if b[n].is_floating_point())


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): t.detach().clone() for n, t in model.state_dict().items()}


class Run:
    """One training run of a case, with DDP or with gradsched through one API."""

    def __init__(self, case: str, kind: str, policy: str, rank: int) -> None:
        torch.manual_seed(0)
        self.net, self.case, self.kind, self.rank = Net(aux=case == "unused"), case, kind, rank
        self.reads: list[torch.Tensor] = []  # every gradient read (no_optimizer)
        self.deferred: list[int] = []  # after each step(): parameters whose update waits for their module
        options = dict(find_unused_parameters=case == "unused")
        ours = dict(policy=policy, policy_options=OPTIONS[policy], profile_rounds=2, replan_every=2, fallback=False,
                    **options)
        if case.startswith("handoff"):
            ours.update(fallback=True, fallback_gain=0.99, trial_rounds=3, trial_pairs=1, replan_every=0)
        if case.endswith("bf16"):
            ours["compression"] = "bf16"
        hooked = case == "hook" and kind == "wrap"
        self.optimizer = None
        if kind == "ddp":
            self.model = DDP(self.net, **options)
        elif kind == "gradsched":
            self.model = gradsched.DistributedDataParallel(self.net, **ours)
        else:
            self.model, self.optimizer = gradsched.wrap(self.net, self.new_optimizer(self.net),
                                                        comm_hook=(None, allreduce_hook) if hooked else None, **ours)
        if self.optimizer is None and case != "no_optimizer":
            self.optimizer = self.new_optimizer(self.model)
        if case.endswith("bf16") and kind == "ddp":
            self.model.register_comm_hook(None, ddp_hook(torch.bfloat16))
        if case == "hook" and not hooked:
            self.model.register_comm_hook(None, allreduce_hook)

    @staticmethod
    def new_optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def no_sync(self):
        return self.optimizer.no_sync() if self.kind == "wrap" else self.model.no_sync()

    def backward(self, x, y) -> None:
        nn.functional.cross_entropy(self.model(x), y).backward()
        time.sleep(PAUSE[0])  # the host's work between passes (a data loader): the messages get queued

    def step(self, index: int, x, y) -> None:
        case = self.case
        if case == "no_sync":
            with self.no_sync():
                self.backward(x.flip(0), y.flip(0))
        elif case == "flag":
            if self.kind == "wrap":
                with self.no_sync():
                    self.backward(x.flip(0), y.flip(0))
            else:
                self.model.require_backward_grad_sync = False
                self.backward(x.flip(0), y.flip(0))
                self.model.require_backward_grad_sync = True
        elif case == "unused":  # aux: on no rank then every rank (even steps); on rank 1 only then none (odd)
            self.net.use_aux = index % 2 == 1 and self.rank == 1
            self.backward(x.flip(0), y.flip(0))
            self.net.use_aux = index % 2 == 0
        elif case in ("two_backward", "no_optimizer"):
            self.backward(x.flip(0), y.flip(0))  # communicates, and is added to by the next
        if case == "no_optimizer":
            self.backward(x, y)
            self.reads += [p.grad.detach().clone() for p in self.model.parameters() if p.grad is not None]
            for p in self.model.parameters():
                p.grad = None
            return
        if case.startswith("handoff") and index >= CLOSURE_FROM:
            self.optimizer.step(lambda: self.backward(x, y))
            self.optimizer.zero_grad()
            return
        self.backward(x, y)
        if case == "clip":
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.05)
        elif case == "clip_value":
            torch.nn.utils.clip_grad_value_(self.model.parameters(), 0.01)
        self.optimizer.step()
        if self.kind != "ddp":  # updates left to each module's forward (the Dependency Proxy), not applied here
            updates = self.coordinator().run.updates
            self.deferred.append(sum(updates.pending(i) for i in range(len(updates.params))))
        self.optimizer.zero_grad()

    def train(self, data: list) -> dict:
        copies: dict[int, weakref.ref] = {}  # compression's wire copies made while gradsched's plane reduced
        made = 0
        for index, (x, y) in enumerate(data):
            self.step(index, x, y)
            for copy in self.wire_copies():
                if id(copy) not in copies or copies[id(copy)]() is None:
                    made += 1
                    copies[id(copy)] = weakref.ref(copy)
        if self.kind != "ddp":
            self.optimizer.synchronize() if self.kind == "wrap" else self.model.synchronize()
        report = {"state": state(self.model), "reads": self.reads}
        if self.kind != "ddp":
            stats = self.optimizer.stats if self.kind == "wrap" else self.model.stats
            gc.collect()
            report.update(handed_off=stats.handed_off_round, rounds=stats.rounds,
                          wire_copies=made, wire_copies_alive=sum(r() is not None for r in copies.values()),
                          deferred=self.deferred,
                          **self.broadcasts())
            (self.optimizer if self.kind == "wrap" else self.model).close()
        return report

    def coordinator(self):
        return self.optimizer._coordinator if self.kind == "wrap" else self.model._binder.coordinator

    def broadcasts(self) -> dict:
        """From the emulated device's log: the buffer broadcasts, and how many of them ran while a
        message of gradients was running (none can where both share a communicator)."""
        co = self.coordinator()
        log = list(getattr(co.run.device, "log", ()))
        data = [(a, b) for name, a, b in log if name == f"nccl-{co.run.topology.data.group_name}"]
        sent = [a for name, a, _ in log if name == f"nccl-{co.run.topology.broadcasts.group_name}"]
        return {"broadcasts": len(sent), "broadcasts_overlapping": sum(any(a <= t < b for a, b in data) for t in sent),
                "broadcasts_ahead": getattr(getattr(co.backend, "buffer_sync", None), "taken_ahead", None)}  # None after the hand-off

    def wire_copies(self) -> list[torch.Tensor]:
        if self.kind == "ddp" or not self.case.endswith("bf16"):
            return []
        co = self.coordinator()
        exchange = getattr(co.backend, "exchange", None)  # None: handed off, the plane gone
        transport = exchange.launcher.transport if exchange is not None else None
        if transport is None:  # the plane's transport closed
            return []
        wire = transport.wire
        with wire._lock:
            held = [c for cache in wire._cache.values() for c in cache.values()]
            return held + [c for taken in wire._busy.values() for _, _, c in taken]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    parser.add_argument("--apis", default="ddp,wrap")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds after each backward pass: shorter than "
                        "the emulated latency, longer than what queueing a round's messages takes")
    args = parser.parse_args()
    PAUSE[0] = args.pause
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {}
    for case in args.cases.split(","):
        data = batches(rank, STEPS.get(case, 6))
        reference = Run(case, "ddp", "fifo", rank).train(data)
        torch.manual_seed(0)
        start = state(Net(aux=case == "unused"))
        for policy in args.policies.split(","):
            for api in args.apis.split(","):
                ours = Run(case, "gradsched" if api == "ddp" else "wrap", policy, rank).train(data)
                diff = difference(ours["state"], reference["state"])
                if reference["reads"]:
                    diff = max(diff, max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(ours["reads"], reference["reads"])))
                report[f"{case}/{policy}/{api}"] = {
                    "max_abs_diff": diff, "moved": difference(ours["state"], start),
                    **{k: ours[k] for k in ("handed_off", "rounds", "wire_copies", "wire_copies_alive", "broadcasts",
                                            "broadcasts_overlapping", "broadcasts_ahead", "deferred")}}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, report)
    finish_with_report(args.out, everyone)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
