"""Worker: train the same model with DDP and with gradsched on every rank; report differences.

    python -m workers.train_compare OUT.json [--policies ...] [--optimizers ...] [--steps N] [--delays]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish

SMALL = {
    "fifo": {"bucket_cap_bytes": 4096, "first_bucket_bytes": 1024},
    "priority": {"partition_bytes": 1024},
    "bytescheduler": {"partition_bytes": 1024, "credit_bytes": 4096},
    "prophet": {"partition_bytes": 512, "credit_bytes": 4096, "fuse_bytes": 2048, "profile_iterations": 2},
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)  # BatchNorm follows: a bias would get only rounding noise
        self.bn = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 6 * 6, 48)
        self.fc2 = nn.Linear(48, 48)
        self.head = nn.Linear(48, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def make_optimizer(kind: str, model: nn.Module):
    if kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    elif kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    elif kind == "adamw-groups":  # two groups with different settings, and an LR schedule
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "lr": 3e-3,
                                                                          "weight_decay": 0.0}], lr=1e-2)
    elif kind == "rmsprop":
        opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.5)
    else:
        raise ValueError(kind)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if kind == "adamw-groups" else None
    return opt, sched


def batches(rank: int, steps: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(steps)]


def slow_backward(model: nn.Module, rank: int, seed: int):
    """Seeded random sleeps in some layers' backward, different on every rank."""
    rng = random.Random(seed * 10 + rank)
    for module in (model.conv, model.fc1, model.fc2, model.head):
        delay = rng.choice([0.0, 0.0, 0.002, 0.01])
        if delay:
            module.register_full_backward_hook(lambda *a, d=delay: time.sleep(d))


def wrapped(policy: str, kind: str, rank: int, delays: bool, seed: int, **options):
    """The seeded model (with backward delays if asked) and optimizer, wrapped with the small
    test options of ``policy``, re-planning often."""
    torch.manual_seed(0)
    model = Net()
    if delays:
        slow_backward(model, rank, seed=seed)
    opt, _ = make_optimizer(kind, model)
    return gradsched.wrap(model, opt, policy=policy, policy_options=SMALL[policy], profile_rounds=2, replan_every=2,
                          **options)


def seeded_reference():
    """The seeded model every run starts from, and a copy of its initial parameters."""
    torch.manual_seed(0)
    reference = Net()
    return reference, [p.detach().clone() for p in reference.parameters()]


def against(model, reference, initial) -> dict:
    """How far ``model`` ended from ``reference`` (parameters and buffers) and from
    ``initial``, and a checksum of its parameters for comparing ranks."""
    final = [p.detach() for p in model.parameters()]
    states = zip(model.state_dict().values(), reference.state_dict().values())
    return {"max_abs_diff": max((a.double() - b.double()).abs().nan_to_num(float("inf")).max().item() for a, b in states),
            "moved": max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(final, initial)),
            "checksum": [float(t.double().sum()) for t in final]}


def train(model, opt, sched, data, use_step_hooks=True):
    loss_fn = nn.CrossEntropyLoss()
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if sched:
            sched.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    parser.add_argument("--optimizers", default="sgd,adam,adamw-groups")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--delays", action="store_true")
    parser.add_argument("--fallback", action="store_true", help="allow falling back to fifo plans")
    parser.add_argument("--no-ddp", action="store_true", help="skip the DDP reference (it crashes under "
                        "TORCH_DISTRIBUTED_DEBUG=DETAIL in this torch build); ranks are compared with each other")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = batches(rank, args.steps)
    report = {}
    for kind in args.optimizers.split(","):
        reference, initial = seeded_reference()
        if not args.no_ddp:
            ddp = DDP(reference)
            opt, sched = make_optimizer(kind, reference)
            train(ddp, opt, sched, data)
        for policy in args.policies.split(","):
            model, opt = wrapped(policy, kind, rank, args.delays, len(report), fallback=args.fallback,
                                 trial_rounds=3)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if kind == "adamw-groups" else None
            train(model, opt, sched, data)
            completing = any(t.name == "gradsched-completion" for t in threading.enumerate())
            opt.synchronize()
            measured = against(model, reference, initial)
            measured["completion_thread"] = completing
            if args.no_ddp:
                measured["max_abs_diff"] = None
            stats = opt.stats.as_dict()
            opt.close()
            report[f"{policy}/{kind}"] = {**measured, **{k: stats[k] for k in ("plans_adopted", "rounds", "plan_policy",
                                                                               "plan_options", "prediction", "trial")}}
    # every rank must hold identical parameters too
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": gathered}, f)
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
