"""Worker: architecture="sharded" against DDP + the same optimizer, on every rank; report the
differences and the optimizer state each rank holds.

    python -m workers.sharded OUT.json [--policies ...] [--optimizers ...] [--steps N] [--scenarios ...]
        [--architecture sharded|fully_sharded]

Scenarios (each for every policy and optimizer): ``wrap`` (gradsched.wrap), ``ddp``
(gradsched.DistributedDataParallel with the optimizer built after it), ``clip`` (global-norm
clipping by gradsched's clip_grad_norm_ against torch's under DDP), ``value`` (clip_grad_value_),
``torchclip`` and ``torchvalue`` (torch's own, ``torch.nn.utils.clip_grad_norm_(model.parameters())``,
as under DDP), ``scaler`` (AMP's GradScaler, whose first steps overflow and are skipped),
``accumulate`` (two backward passes per step, the first under ``no_sync()``), ``checkpoint``
(the optimizer's full state half-way against DDP's, and a resumed run), ``slow`` (the
all-gather of the head's parameters lands 0.1 s late: a forward that did not wait for it
would compute with the head's old weights), ``compress`` (compression="bf16": both phases
in bf16, against DDP with the bf16 hook whose optimizer steps fp32 masters of parameters
that every forward after the first computes with rounded to bf16, as sharding with
compression does; half-way every parameter is loaded anew, from its initial values, which
the masters must take over).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from gradsched.runtime.comm.compression import ddp_hook
from workers.launch import finish_with_every_report
from workers.train_compare import SMALL, Net, against, batches, make_optimizer


class ScaledNet(Net):
    """``Net`` whose logits are multiplied by a learnable 0-dimensional temperature (as CLIP's
    ``logit_scale``): replicated, not sharded, under sharding."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(1.25))

    def forward(self, x):
        return super().forward(x) * self.temperature


MODEL = {"net": Net}  # or ScaledNet (--scalar)


def new_net() -> nn.Module:
    return MODEL["net"]()


def seeded_reference():
    """The seeded model every run starts from, and a copy of its initial parameters."""
    torch.manual_seed(0)
    reference = new_net()
    return reference, [p.detach().clone() for p in reference.parameters()]

OPTIMIZERS = {"adagrad": lambda params: torch.optim.Adagrad(params, lr=0.05),
              "adam-fused": lambda params: torch.optim.Adam(params, lr=1e-2, fused=True)}


def optimizer_for(kind: str, model: nn.Module):
    if kind in OPTIMIZERS:
        return OPTIMIZERS[kind](model.parameters()), None
    return make_optimizer(kind, model)


def state_elements(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() for state in opt.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


LATE = {"on": False}  # the slow scenario runs
ARCHITECTURE = {"name": "sharded"}  # or "fully_sharded" (--architecture)


def slow_head_gathers() -> None:
    """While ``LATE["on"]``, every all-gather that carries the head's weight is issued 0.1 s
    late on every rank, so its parameters land at least that late."""
    from gradsched.runtime.architectures.sharded.shards import Shards

    gather, gather_whole = Shards.gather, Shards.gather_whole

    def late(self, message, group, device):
        if LATE["on"] and any(name.startswith("head.") for name, _, _ in message.slices):
            time.sleep(0.1)
        return gather(self, message, group, device)

    def late_whole(self, indices, pairwise, group, device):  # fully sharded: before forward and backward
        if LATE["on"] and any(self.names[i].startswith("head.") for i in indices):
            time.sleep(0.1)
        return gather_whole(self, indices, pairwise, group, device)

    Shards.gather, Shards.gather_whole = late, late_whole


def run(model, opt, sched, data, clip: str | None, clip_of=None, accumulate: bool = False,
        rounded: torch.dtype | None = None, reload: dict | None = None, scaled: bool = False) -> list[float]:
    """``rounded`` (the reference of a compressed sharded run): the optimizer steps masters, the
    forward passes after a step compute with them rounded to that dtype; ``reload``: a state
    loaded into the model half-way (the masters become it)."""
    masters = None
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=2) if scaled else None
    scales = []
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        if accumulate:
            with model.no_sync():
                nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
            x, y = x[8:], y[8:]
        loss = nn.functional.cross_entropy(model(x), y)
        if scaler is not None:  # the first step overflows (2^127 x 4 x a loss above 0.5 is past float32): skipped
            scaler.scale(loss * 4.0).backward()
            scaler.unscale_(opt)  # its found_inf agreed by every rank (DTensor gradients: over the mesh)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
            if sched:
                sched.step()
            continue
        loss.backward()
        if clip == "clip":
            clip_of(0.5)
        elif clip == "value":
            clip_of(0.01)
        if masters is not None:
            with torch.no_grad():
                for p, master in zip(model.parameters(), masters):
                    p.copy_(master)
        opt.step()
        if sched:
            sched.step()
        if rounded is not None:
            masters = [p.detach().clone() for p in model.parameters()]
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(rounded))
        if reload is not None and step == len(data) // 2 - 1:
            getattr(model, "module", model).load_state_dict(reload)
            masters = None
    return scales


def differences(a: dict, b: dict) -> float:
    """The largest difference between two optimizers' ``state_dict()["state"]``."""
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    worst = 0.0
    for position in a:
        assert a[position].keys() == b[position].keys()
        for key, value in a[position].items():
            other = b[position][key]
            assert torch.is_tensor(value) and value.shape == other.shape, (position, key)
            worst = max(worst, (value.double() - other.double()).abs().nan_to_num(float("inf")).max().item())
    return worst


def checkpoint(policy: str, kind: str, data: list) -> dict:
    """Half the run sharded, the optimizer's full state (every rank's shards joined) against
    DDP's optimizer at the same step; then a new sharded run resumes from that checkpoint and
    ends where DDP's uninterrupted run ends."""
    half = len(data) // 2
    reference, initial = seeded_reference()
    ddp = DDP(reference)
    opt, sched = optimizer_for(kind, reference)
    run(ddp, opt, sched, data[:half], None)
    ddp_half = copy.deepcopy(opt.state_dict())
    run(ddp, opt, sched, data[half:], None)
    options = dict(policy=policy, policy_options=SMALL[policy], profile_rounds=2, replan_every=2,
                   architecture=ARCHITECTURE["name"])
    torch.manual_seed(0)
    net = new_net()
    model, ours = gradsched.wrap(net, optimizer_for(kind, net)[0], **options)
    sched = torch.optim.lr_scheduler.StepLR(ours, step_size=2, gamma=0.5) if kind == "adamw-groups" else None
    run(model, ours, sched, data[:half], None)
    mine = ours.state_dict()  # this rank's part: loading another rank's is refused, with what to do
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    try:
        ours.load_state_dict(parts[(dist.get_rank() + 1) % len(parts)])
        refused = None
    except gradsched.GradschedError as error:
        refused = str(error)
    ours.load_state_dict(mine)  # its own part loads
    live = state_elements(ours._inner)  # this rank's shards of the optimizer's state
    full = ours.full_state_dict()  # whole on rank 0; the others hold no state of it
    joined_here = sum(v.numel() for entry in full["state"].values() for v in entry.values()
                      if torch.is_tensor(v) and v.dim() > 0)
    grew = state_elements(ours._inner) - live  # the live state must stay the shards
    received = [full]  # the DDP user's habit: rank 0 saves, every rank loads that file
    dist.broadcast_object_list(received, src=0)
    full = received[0]
    state = net.state_dict()  # fully sharded: each parameter this rank's shard (a DTensor), as FSDP2's
    sharded = copy.deepcopy(state)
    whole = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
    saved = {"model": copy.deepcopy(whole), "optimizer": copy.deepcopy(full),
             "scheduler": sched.state_dict() if sched else None}
    ours.close()
    torch.manual_seed(1)  # the resumed run's own initialisation, replaced by the checkpoint
    net = new_net()
    if ARCHITECTURE["name"] == "sharded":
        net.load_state_dict(saved["model"])
    model, ours = gradsched.wrap(net, optimizer_for(kind, net)[0], **options)
    if ARCHITECTURE["name"] == "fully_sharded":  # into the shards, from this rank's parts of the first run
        net.load_state_dict(sharded)
    ours.load_state_dict(saved["optimizer"])
    sched = torch.optim.lr_scheduler.StepLR(ours, step_size=2, gamma=0.5) if kind == "adamw-groups" else None
    if sched:
        sched.load_state_dict(saved["scheduler"])
    run(model, ours, sched, data[half:], None)
    ours.close()  # every parameter whole
    result = against(net, reference, initial)
    result.update(state_diff=differences(full["state"], ddp_half["state"]), state=0, ddp_state=0,
                  live_state_grew=grew, joined_here=joined_here, ddp_state_elements=state_elements(opt),
                  refused=refused)
    return result


def torch_clip_of(model, clip: str):
    """torch's own clipping over the model's parameters, as a DDP script calls it: ``.grad`` is
    each rank's shard of the average (a DTensor), and torch's norm of them is the global one."""
    if clip == "clip":
        return lambda m: torch.nn.utils.clip_grad_norm_(model.parameters(), m)
    return lambda v: torch.nn.utils.clip_grad_value_(model.parameters(), v)


def case(scenario: str, kind: str, policies: list[str], data: list, report: dict) -> None:
    if scenario == "checkpoint":
        for policy in policies:
            report[f"checkpoint/{policy}/{kind}"] = checkpoint(policy, kind, data)
        return
    clip = {"torchclip": "clip", "torchvalue": "value"}.get(scenario, scenario if scenario in ("clip", "value")
                                                                      else None)
    compress = scenario == "compress"
    reference, initial = seeded_reference()
    reload = copy.deepcopy(reference.state_dict()) if compress else None
    plain = None
    if compress:  # without compression, to show that compression changed the result
        plain, _ = seeded_reference()
        run(DDP(plain), *optimizer_for(kind, plain), data, None, reload=reload)
    ddp = DDP(reference)
    if compress:
        ddp.register_comm_hook(None, ddp_hook(torch.bfloat16))
    opt, sched = optimizer_for(kind, reference)
    torch_clip = {"clip": lambda m: torch.nn.utils.clip_grad_norm_(ddp.parameters(), m),
                  "value": lambda v: torch.nn.utils.clip_grad_value_(ddp.parameters(), v)}.get(clip)
    accumulate = scenario == "accumulate"
    scaled = scenario == "scaler"
    LATE["on"] = scenario == "slow"
    ddp_scales = run(ddp, opt, sched, data, clip, torch_clip, accumulate, torch.bfloat16 if compress else None, reload,
                     scaled)
    full_state = state_elements(opt)
    for policy in policies:
        torch.manual_seed(0)
        net = new_net()
        options = dict(policy=policy, policy_options=SMALL[policy], profile_rounds=2, replan_every=2,
                       architecture=ARCHITECTURE["name"], compression="bf16" if compress else None)
        if scenario in ("ddp", "accumulate"):
            model = gradsched.DistributedDataParallel(net, **options)
            opt, _ = optimizer_for(kind, model)
            ours = opt
        else:
            model, ours = gradsched.wrap(net, optimizer_for(kind, net)[0], **options)
        sched = torch.optim.lr_scheduler.StepLR(ours, step_size=2, gamma=0.5) if kind == "adamw-groups" \
            else None
        clip_of = None if clip is None else (model.clip_grad_norm_ if clip == "clip" and scenario == "ddp"
                                             else ours.clip_grad_norm_ if scenario == "clip"
                                             else ours.clip_grad_value_ if scenario == "value"
                                             else torch_clip_of(model, clip))
        scales = run(model, ours, sched, data, clip, clip_of, accumulate, reload=reload, scaled=scaled)
        wrapped = scenario in ("ddp", "accumulate")
        (model if wrapped else ours).close()  # every parameter whole (fully sharded frees them between uses)
        result = against(model.module if wrapped else net, reference, initial)
        result.update(state=state_elements(ours), ddp_state=full_state)
        if scaled:  # the same steps skipped as DDP's, at least one
            result.update(scales=scales, ddp_scales=ddp_scales)
        if plain is not None:
            result["uncompressed_diff"] = against(net, plain, initial)["max_abs_diff"]
        report[f"{scenario}/{policy}/{kind}"] = result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--policies", default="fifo,priority,bytescheduler,prophet")
    parser.add_argument("--optimizers", default="sgd,adam,adamw-groups,rmsprop")
    parser.add_argument("--scenarios", default="wrap,ddp,clip")
    parser.add_argument("--cases", help="SCENARIO:OPTIMIZER,... in place of every scenario with every optimizer")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--architecture", default="sharded", choices=["sharded", "fully_sharded"])
    parser.add_argument("--scalar", action="store_true", help="the model holds a 0-dimensional parameter")
    args = parser.parse_args()
    ARCHITECTURE["name"] = args.architecture
    MODEL["net"] = ScaledNet if args.scalar else Net
    if "slow" in args.scenarios.split(",") or "slow:" in (args.cases or ""):
        slow_head_gathers()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = batches(rank, args.steps)
    report = {}
    cases = [tuple(case.split(":")) for case in args.cases.split(",")] if args.cases else \
        [(scenario, kind) for kind in args.optimizers.split(",") for scenario in args.scenarios.split(",")]
    for scenario, kind in cases:
        case(scenario, kind, args.policies.split(","), data, report)
    finish_with_every_report(args.out, report)


if __name__ == "__main__":
    main()
