"""Worker: gradsched against DDP on the harder cases, one scenario after another.

    python -m workers.features OUT.json SCENARIO[,SCENARIO...]

Scenarios: unused, frozen, tied, accumulate, clip, buffers, checkpoint, world-errors; and
tied-fully_sharded, unused-sharded, unused-fully_sharded (the same under those architectures).
Each reports the largest difference to its DDP reference (parameters and buffers) and how
far the parameters moved, so a test can tell "equal" from "nothing happened".
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish_with_every_report
from gradsched.runtime import GradschedError

POLICIES = ["fifo", "bytescheduler", "prophet"]
OPTIONS = {"fifo": {}, "bytescheduler": {"partition_bytes": 1024, "credit_bytes": 4096},
           "prophet": {"partition_bytes": 512, "credit_bytes": 4096, "fuse_bytes": 2048, "profile_iterations": 2}}


class Branchy(nn.Module):
    """``extra`` is used only on odd steps of rank 1; ``never`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(12, 16)
        self.extra = nn.Linear(16, 16)
        self.never = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.use_extra = False

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.use_extra:
            h = torch.relu(self.extra(h))
        return self.head(h)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.mix = nn.Linear(16, 16)
        self.out = nn.Linear(16, 20, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mix(self.embed(tokens)))).mean(1)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class Normed(nn.Module):
    """BatchNorm: running statistics (buffers) of each rank's own data."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 32)
        self.norm = nn.BatchNorm1d(32)
        self.c = nn.Linear(32, 4)

    def forward(self, x):
        return self.c(torch.relu(self.norm(self.a(x))))


def data(rank: int, steps: int, tokens: bool = False):
    g = torch.Generator().manual_seed(7 + rank)
    if tokens:
        return [(torch.randint(0, 20, (8, 5), generator=g), torch.randint(0, 20, (8,), generator=g)) for _ in range(steps)]
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(steps)]


def compare(model: nn.Module, reference: nn.Module, initial: list[torch.Tensor]) -> dict:
    diff = max((a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
               for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    moved = max((p.detach() - q).abs().nan_to_num(float("inf")).max().item() for p, q in zip(model.parameters(), initial))
    buffers = float(sum(b.double().sum() for b in model.buffers() if b.is_floating_point()))
    return {"diff": diff, "moved": moved, "buffer_sum": buffers}


# Adam hardly changes its step when every gradient is scaled by a constant, so a wrong
# divisor (the world size against the ranks that used a parameter, accumulated
# micro-batches) would pass with Adam alone; plain SGD's step is proportional to it.
OPTIMIZERS = {"adam": lambda params: torch.optim.Adam(params, lr=1e-2),
              "sgd": lambda params: torch.optim.SGD(params, lr=0.5)}


def run_pair(make, scenario, rank, steps=6, **wrap_kwargs):
    """Train DDP and every policy with the same loop ``scenario(model, opt, batch, step)``,
    with each optimizer; results by "policy/optimizer"."""
    results = {}
    for name, optimizer in OPTIMIZERS.items():
        torch.manual_seed(0)
        reference = make()
        initial = [p.detach().clone() for p in reference.parameters()]
        if not os.environ.get("NO_DDP"):
            ddp = DDP(reference, find_unused_parameters=wrap_kwargs.get("find_unused_parameters", False),
                      broadcast_buffers=wrap_kwargs.get("broadcast_buffers", True))
            opt = optimizer([p for p in reference.parameters() if p.requires_grad])
            for step, batch in enumerate(data(rank, steps, tokens=isinstance(reference, Tied))):
                scenario(ddp, reference, opt, batch, step, rank, wrapped=False)
        for policy in POLICIES:
            torch.manual_seed(0)
            model = make()
            opt = optimizer([p for p in model.parameters() if p.requires_grad])
            model, opt = gradsched.wrap(model, opt, policy, policy_options=OPTIONS[policy], profile_rounds=2,
                                        replan_every=2, fallback=False, **wrap_kwargs)
            for step, batch in enumerate(data(rank, steps, tokens=isinstance(model, Tied))):
                scenario(model, model, opt, batch, step, rank, wrapped=True)
            opt.close()  # (sharded: every parameter whole, the model the user's again)
            results[f"{policy}/{name}"] = compare(model, reference, initial)
    return results


def plain_step(model, inner, opt, batch, step, rank, wrapped):
    x, y = batch
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def unused_step(model, inner, opt, batch, step, rank, wrapped):
    inner.use_extra = rank == 1 and step % 2 == 1
    plain_step(model, inner, opt, batch, step, rank, wrapped)


def accumulate_step(model, inner, opt, batch, step, rank, wrapped):
    x, y = batch
    opt.zero_grad()
    with model.no_sync() if not wrapped else opt.no_sync():
        nn.functional.cross_entropy(model(x[:4]), y[:4]).backward()
    nn.functional.cross_entropy(model(x[4:]), y[4:]).backward()
    opt.step()


def clip_step(model, inner, opt, batch, step, rank, wrapped):
    x, y = batch
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    if wrapped:
        opt.synchronize()  # clipping reads every gradient: wait for all of them first
    torch.nn.utils.clip_grad_norm_(inner.parameters(), 0.05)
    opt.step()


def frozen() -> nn.Module:
    torch.manual_seed(0)
    model = Plain()
    model.b.weight.requires_grad_(False)
    return model


def checkpoint(rank: int) -> dict:
    """Save after 3 of 8 steps; resume (a) wrapped, (b) into a plain optimizer under DDP."""
    batches = data(rank, 8)
    options = dict(policy_options=OPTIONS["prophet"], profile_rounds=2, replan_every=2, fallback=False)
    torch.manual_seed(0)
    model = Plain()
    model, opt = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-2), "prophet", **options)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step, batch in enumerate(batches):
        plain_step(model, model, opt, batch, step, rank, True)
        sched.step()
        if step == 2:
            saved = _clone({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()})
    opt.synchronize()  # the last update waits for the next forward otherwise
    final = [p.detach().clone() for p in model.parameters()]
    opt.close()

    def resume(wrapped: bool):
        torch.manual_seed(1)  # different initial values: everything must come from the checkpoint
        fresh = Plain()
        fresh.load_state_dict(saved["model"])
        optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        if wrapped:
            runner, optimizer = gradsched.wrap(fresh, optimizer, "prophet", **options)
        else:
            runner = DDP(fresh)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        optimizer.load_state_dict(_clone(saved["opt"]))
        scheduler.load_state_dict(saved["sched"])
        for step, batch in enumerate(batches[3:], start=3):
            plain_step(runner, fresh, optimizer, batch, step, rank, wrapped)
            scheduler.step()
        state = optimizer.state_dict()  # synchronizes a wrapped optimizer
        diff = max((a - p.detach()).abs().nan_to_num(float("inf")).max().item() for a, p in zip(final, fresh.parameters()))
        if wrapped:
            optimizer.close()
        return diff, state

    plain_diff, plain_state = resume(False)
    wrapped_diff, wrapped_state = resume(True)
    return {"resume_diff": wrapped_diff, "unwrapped_resume_diff": plain_diff,
            "same_format": list(wrapped_state["state"]) == list(plain_state["state"])
            and [sorted(g) for g in wrapped_state["param_groups"]] == [sorted(g) for g in plain_state["param_groups"]],
            "saved_step": int(saved["opt"]["state"][0]["step"]),
            "moved": max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(final, saved["model"].values()))}


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def world_errors(rank: int) -> dict:
    """Misuse that only shows across ranks: different parameters, different configurations."""
    out = {}
    torch.manual_seed(rank)  # different initial values on each rank
    model = Plain()
    try:
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
        out["values"] = "no error"
    except GradschedError as exc:
        out["values"] = str(exc)
    torch.manual_seed(0)
    model = Plain()
    try:
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "bytescheduler",
                       policy_options={"credit_bytes": 4 << 20 if rank == 0 else 8 << 20})
        out["config"] = "no error"
    except GradschedError as exc:
        out["config"] = str(exc)
    def wider(m: Plain) -> Plain:
        m.b, m.c = nn.Linear(32, 33), nn.Linear(33, 4)
        return m

    mismatched = {  # rank 1 wraps a model that differs from rank 0's in one way
        "names": lambda m: nn.Sequential(m.a, nn.ReLU(), m.b, nn.ReLU(), m.c),
        "shapes": wider,
        "dtypes": lambda m: m.double(),
    }
    for case, change in mismatched.items():
        torch.manual_seed(0)
        model = Plain() if rank == 0 else change(Plain())
        try:
            gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), broadcast_parameters=True)
            out[case] = "no error"
        except GradschedError as exc:
            out[case] = str(exc)
    torch.manual_seed(rank)
    model = Plain()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), broadcast_parameters=True)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, float(sum(p.double().sum() for p in model.parameters())))
    out["broadcast_equal"] = len(set(gathered)) == 1
    opt.close()
    return out


def main() -> None:
    out_path, scenarios = sys.argv[1], sys.argv[2].split(",")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {}
    for name in scenarios:
        if name == "unused":
            report[name] = run_pair(Branchy, unused_step, rank, find_unused_parameters=True)
        elif name == "frozen":
            report[name] = run_pair(frozen, plain_step, rank)
        elif name == "tied":
            report[name] = run_pair(Tied, plain_step, rank)
        elif name == "tied-fully_sharded":
            report[name] = run_pair(Tied, plain_step, rank, architecture="fully_sharded")
        elif name.startswith("unused-"):  # unused-sharded, unused-fully_sharded
            report[name] = run_pair(Branchy, unused_step, rank, find_unused_parameters=True,
                                    architecture=name.split("-", 1)[1])
        elif name == "accumulate":
            report[name] = run_pair(Plain, accumulate_step, rank)
        elif name == "clip":
            report[name] = run_pair(Plain, clip_step, rank)
        elif name == "buffers":
            report[name] = run_pair(Normed, plain_step, rank, broadcast_buffers=False)
        elif name == "checkpoint":
            report[name] = checkpoint(rank)
        elif name == "world-errors":
            report[name] = world_errors(rank)
    finish_with_every_report(out_path, report)


if __name__ == "__main__":
    main()
