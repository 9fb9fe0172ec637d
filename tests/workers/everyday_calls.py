"""Worker: the calls real DDP scripts and the libraries built on DDP make, with
``gradsched.DistributedDataParallel`` in DDP's place, each against torch's DDP on the same data.

    python -m workers.everyday_calls OUT.json SCENARIO[,SCENARIO...]

Scenarios (2 ranks unless said):

* ``rng``: a script that seeds, builds, wraps, then draws every batch from torch's global
  generator (as GPT training scripts do), for 80 steps (BatchNorm, AdamW, a cosine schedule,
  global-norm clipping), long enough for the probe, the measured trial forced each way (the
  policy kept and re-planned, or the buckets handed to DDP's reducer) and, for one run, the
  online tuner; every policy, both APIs: the generator's state after the wrap and after
  training, and the weights, against DDP's;
* ``accumulate-flag``: gradient accumulation by ``model.require_backward_grad_sync = last``
  (no ``no_sync()``), with BatchNorm: weights and buffers against DDP's, DDP's
  ``require_forward_param_sync`` after every forward pass, and the backward passes that
  communicated (one per step, not one per micro-step);
* ``ignored``: ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model`` with a
  parameter and a buffer that differ per rank;
* ``sparse``: ``nn.Embedding(sparse=True)`` next to dense layers (SGD steps it);
* ``group``: ``process_group=new_group(every rank)`` and a 1-D ``device_mesh``;
* ``subgroups`` (4 ranks): two replica groups of 2 (``new_subgroups``), each training its own
  copy on its own data, against DDP with the same subgroup;
* ``comm-hooks``: PyTorch's allreduce, fp16 and bf16 compress hooks, their wrappers and a user's
  own hook returning a Future, registered with ``register_comm_hook`` (and ``wrap``'s
  ``comm_hook=``), against DDP with the same hook;
* ``powersgd``: PowerSGD (rank 2, error feedback, warm start, from iteration 3) on a partitioned,
  re-planned prophet schedule and on fifo's single message, against DDP + PowerSGD: the loss on a
  held-out set after 120 steps, and fifo's weights (its one message is DDP's one bucket).

Each reports the largest difference to its DDP reference and how far the weights moved, so a
test can tell "equal" from "nothing happened".
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from workers.launch import finish_with_every_report

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
SMALL = {"fifo": {}, "priority": {"partition_bytes": 2048},
         "bytescheduler": {"partition_bytes": 2048, "credit_bytes": 8192},
         "prophet": {"partition_bytes": 2048, "credit_bytes": 8192, "fuse_bytes": 4096, "profile_iterations": 2}}


class Net(nn.Module):
    def __init__(self, norm: bool = False, inputs: int = 12, width: int = 48) -> None:
        super().__init__()
        self.a = nn.Linear(inputs, width)
        self.norm = nn.BatchNorm1d(width) if norm else nn.Identity()
        self.b = nn.Linear(width, width)
        self.c = nn.Linear(width, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.norm(self.a(x))))))


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 16, sparse=True)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens)))).mean(1)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    inner = model.module if isinstance(model, TorchDDP) else model
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def difference(a: dict, b: dict, floating_only: bool = False) -> float:
    assert a.keys() == b.keys()
    keys = [k for k in a if a[k].numel() and (a[k].is_floating_point() or not floating_only)]
    return max(((a[k].double() - b[k].double()).abs().nan_to_num(float("inf")).max().item() for k in keys), default=0.0)


def moved(trained: dict, start: dict) -> float:
    """How far the weights (floating-point state) moved in training."""
    return difference(trained, start, floating_only=True)


def wrapper(policy: str | None):
    """The class a script's ``DDP(...)`` line builds: torch's (policy None) or gradsched's."""
    if policy is None:
        return TorchDDP
    return lambda module, **kw: gradsched.DistributedDataParallel(module, policy=policy, **kw)


def close(model) -> None:
    if isinstance(model, gradsched.DistributedDataParallel):
        model.close()


def attach(net: nn.Module, optimizer, policy: str | None, api: str = "ddp", **options):
    """(what forward runs on, the optimizer to step): torch's DDP (policy None), gradsched's
    DistributedDataParallel or gradsched.wrap, with DDP's (or gradsched's) keyword ``options``."""
    if policy is None:
        return TorchDDP(net, **options), optimizer
    ours = {"policy_options": SMALL[policy], "fallback": False, **options}
    if api == "wrap":
        return gradsched.wrap(net, optimizer, policy, **ours)
    return gradsched.DistributedDataParallel(net, policy=policy, **ours), optimizer


def release(model, optimizer) -> None:
    """Close what :func:`attach` attached."""
    if isinstance(model, gradsched.DistributedDataParallel):
        model.close()
    elif isinstance(optimizer, gradsched.ScheduledOptimizer):
        optimizer.close()


def train_steps(model, optimizer, g: torch.Generator, steps: int, inputs: int = 12) -> None:
    """``steps`` plain steps of cross-entropy on batches drawn from ``g``."""
    for _ in range(steps):
        x, y = torch.randn(8, inputs, generator=g), torch.randint(0, 4, (8,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


# -- rng --------------------------------------------------------------------------------------
def rng_run(rank: int, policy: str | None, steps: int, api: str = "ddp", **options) -> dict:
    torch.manual_seed(1337 + rank)  # as GPT scripts seed: one offset per rank (the wrap copies rank 0's weights)
    model = Net(norm=True)
    before = torch.get_rng_state()
    if api == "wrap":
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        model, optimizer = gradsched.wrap(model, optimizer, policy, broadcast_parameters=True, **options)
    else:
        model = wrapper(policy)(model, **options)
    after_wrap = torch.get_rng_state()
    if api != "wrap":
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    for _ in range(steps):
        x, y = torch.randn(16, 12) * (1 + rank), torch.randint(0, 4, (16,))  # the user's stream
        nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    out = {"wrap_kept_rng": bool(torch.equal(before, after_wrap)), "after_wrap": after_wrap,
           "after_steps": torch.get_rng_state(), "weights": weights(model)}
    if policy is not None:
        stats = (optimizer if api == "wrap" else model).stats
        out["handed_off"] = stats.handed_off_round is not None
        out["settled"] = stats.settled_round
        out["replans"] = stats.plans_adopted
        out["tuned"] = stats.autotune is not None
        out["trial"] = None if stats.trial is None else [stats.trial.policy_s, stats.trial.fifo_s, stats.trial.by]
        (optimizer if api == "wrap" else model).close()
    return out


def rng(rank: int) -> dict:
    """80 steps of BatchNorm, AdamW, a cosine schedule and global-norm clipping, every batch
    drawn from the user's generator."""
    steps = 80
    ddp = rng_run(rank, None, steps)
    start = rng_run(rank, None, 0)
    report = {"moved": moved(ddp["weights"], start["weights"]), "ddp_wrap_kept_rng": ddp["wrap_kept_rng"]}
    # the measured trial, forced each way: buckets kept and handed to DDP's reducer (the policy would have
    # to measure 100x faster), or the policy kept (it would have to measure 100x slower); and the online tuner
    trial = {"trial_rounds": 3, "trial_pairs": 1, "replan_every": 20}
    runs = {policy: (policy, SMALL[policy], dict(trial, fallback_gain=0.99)) for policy in POLICIES}
    runs.update({f"{policy}-kept": (policy, SMALL[policy], dict(trial, fallback_gain=-99.0))
                 for policy in POLICIES if policy != "fifo"})
    runs["bytescheduler-tuned"] = ("bytescheduler", SMALL["bytescheduler"],
                                   {"autotune": True, "autotune_trials": 3, "trial_rounds": 3, "fallback": False})
    # gradsched.wrap: every policy and each outcome once (the DDP API runs every combination)
    wrap_runs = ("fifo", "priority-kept", "bytescheduler", "prophet-kept", "bytescheduler-tuned")
    for api in ("ddp", "wrap"):
        for name, (policy, policy_options, options) in runs.items():
            if api == "wrap" and name not in wrap_runs:
                continue
            ours = rng_run(rank, policy, steps, api, policy_options=policy_options, **options)
            report[f"{name}/{api}"] = {
                "wrap_kept_rng": ours["wrap_kept_rng"],
                "rng_after_wrap_equal": bool(torch.equal(ours["after_wrap"], ddp["after_wrap"])),
                "rng_after_steps_equal": bool(torch.equal(ours["after_steps"], ddp["after_steps"])),
                "diff": difference(ours["weights"], ddp["weights"]),
                **{k: ours[k] for k in ("handed_off", "settled", "replans", "tuned", "trial")}}
    return report


# -- accumulate-flag ---------------------------------------------------------------------------
def accumulate_run(rank: int, policy: str | None, steps: int = 6, micro: int = 3) -> dict:
    torch.manual_seed(0)
    model = wrapper(policy)(Net(norm=True), **({"policy_options": SMALL[policy], "fallback": False}
                                               if policy else {}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(5 + rank)
    flags = []
    for step in range(steps):
        for k in range(micro):
            model.require_backward_grad_sync = k == micro - 1  # as nanoGPT's loop: sync on the last micro-step
            x, y = torch.randn(8, 12, generator=g) * (1 + rank), torch.randint(0, 4, (8,), generator=g)
            (nn.functional.cross_entropy(model(x), y) / micro).backward()
            flags.append(bool(model.require_forward_param_sync))
        optimizer.step()
        optimizer.zero_grad()
        if step % 2 == 1:  # an evaluation between steps, as scripts run it
            with torch.no_grad():
                model.eval()
                model(torch.randn(4, 12, generator=g))
                model.train()
            flags.append(bool(model.require_forward_param_sync))
    out = {"weights": weights(model), "flags": flags}
    if policy is not None:
        out["rounds"] = model.stats.rounds
    close(model)
    return out


def accumulate_flag(rank: int) -> dict:
    ddp = accumulate_run(rank, None)
    start = accumulate_run(rank, None, steps=0)
    report = {"moved": moved(ddp["weights"], start["weights"]), "steps": 6}
    for policy in POLICIES:
        ours = accumulate_run(rank, policy)
        report[policy] = {"diff": difference(ours["weights"], ddp["weights"]), "rounds": ours["rounds"],
                          "flags_equal": ours["flags"] == ddp["flags"]}
    return report


# -- ignored -----------------------------------------------------------------------------------
def ignored_run(rank: int, policy: str | None, steps: int = 5) -> dict:
    torch.manual_seed(0)
    net = Net(norm=True)
    with torch.no_grad():  # differ per rank: DDP neither copies nor reduces them
        net.b.weight.add_(0.1 * rank)
        net.norm.running_mean.add_(rank)
    TorchDDP._set_params_and_buffers_to_ignore_for_model(net, ["b.weight", "norm.running_mean"])
    model, optimizer = attach(net, torch.optim.SGD(net.parameters(), lr=0.1), policy)
    train_steps(model, optimizer, torch.Generator().manual_seed(9 + rank), steps)
    out = weights(model)
    release(model, optimizer)
    return out


def ignored(rank: int) -> dict:
    ddp = ignored_run(rank, None)
    report = {"moved": moved(ddp, ignored_run(rank, None, steps=0))}
    for policy in POLICIES:
        report[policy] = {"diff": difference(ignored_run(rank, policy), ddp)}
    gathered = [None, None]
    dist.all_gather_object(gathered, float(ddp["b.weight"].sum()))
    report["ignored_differs_across_ranks"] = gathered[0] != gathered[1]
    return report


# -- sparse ------------------------------------------------------------------------------------
def sparse_run(rank: int, policy: str | None, api: str = "ddp", steps: int = 6) -> dict:
    torch.manual_seed(0)
    net = Embedded()
    model, optimizer = attach(net, torch.optim.SGD(net.parameters(), lr=0.5), policy, api)
    g = torch.Generator().manual_seed(3 + rank)
    for step in range(steps):
        tokens, y = torch.randint(0, 30, (8, 5), generator=g), torch.randint(0, 4, (8,), generator=g)
        if step % 3 == 0:  # accumulated sparse gradients too
            with model.no_sync() if api == "ddp" else optimizer.no_sync():
                nn.functional.cross_entropy(model(tokens), y).backward()
        nn.functional.cross_entropy(model(tokens), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    out = weights(net)
    release(model, optimizer)
    return out


def sparse(rank: int) -> dict:
    ddp = sparse_run(rank, None)
    report = {"moved": moved(ddp, sparse_run(rank, None, steps=0))}
    for policy in POLICIES:
        report[policy] = {"diff": difference(sparse_run(rank, policy), ddp)}
    report["wrap"] = {"diff": difference(sparse_run(rank, "prophet", "wrap"), ddp)}
    return report


# -- process groups ----------------------------------------------------------------------------
def group_run(rank: int, policy: str | None, group, seed: int, steps: int = 5, api: str = "ddp", **how) -> dict:
    torch.manual_seed(seed)
    net = Net()
    model, optimizer = attach(net, torch.optim.SGD(net.parameters(), lr=0.2), policy, api,
                              **({"process_group": group} if group is not None else {}), **how)
    train_steps(model, optimizer, torch.Generator().manual_seed(11 + rank), steps)
    out = weights(net)
    release(model, optimizer)
    return out


def group(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    everyone = dist.new_group(list(range(dist.get_world_size())))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ddp = group_run(rank, None, everyone, 0)
    report = {"moved": moved(ddp, group_run(rank, None, everyone, 0, steps=0))}
    for policy in POLICIES:
        report[policy] = {"diff": difference(group_run(rank, policy, everyone, 0), ddp),
                          "mesh_diff": difference(group_run(rank, policy, None, 0, device_mesh=mesh), ddp)}
    report["wrap"] = {"diff": difference(group_run(rank, "bytescheduler", everyone, 0, api="wrap"), ddp)}
    return report


def subgroups(rank: int) -> dict:
    mine, _ = dist.new_subgroups(2)  # ranks {0, 1} and {2, 3}
    seed = dist.get_rank(group=None) // 2  # each replica group starts from its own weights
    ddp = group_run(rank, None, mine, seed)
    report = {"moved": moved(ddp, group_run(rank, None, mine, seed, steps=0))}
    for policy in POLICIES:
        report[policy] = {"diff": difference(group_run(rank, policy, mine, seed), ddp)}
    report["wrap"] = {"diff": difference(group_run(rank, "prophet", mine, seed, api="wrap"), ddp)}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, float(ddp["c.weight"].sum()))
    report["replicas_equal_within_and_differ_across"] = (gathered[0] == gathered[1] and gathered[2] == gathered[3]
                                                         and gathered[0] != gathered[2])
    return report


# -- communication hooks -----------------------------------------------------------------------
def own_hook(state, bucket):
    """A user's hook returning a Future: average on the group it is given, counted per bucket."""
    group = state if isinstance(state, dist.ProcessGroup) else dist.group.WORLD
    buffer = bucket.buffer().div_(dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as d

    return {"allreduce": d.allreduce_hook, "fp16": d.fp16_compress_hook, "bf16": d.bf16_compress_hook,
            "fp16-wrapper": d.fp16_compress_wrapper(d.allreduce_hook),
            "bf16-wrapper": d.bf16_compress_wrapper(d.allreduce_hook), "own": own_hook}


def hook_run(rank: int, policy: str | None, hook, steps: int = 6, api: str = "ddp") -> dict:
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    model, optimizer = attach(net, optimizer, policy, api, **({"comm_hook": (None, hook)} if api == "wrap" else {}))
    if hook is not None and api == "ddp":  # (torch's DDP refuses its bf16 hooks by name without CUDA: passed
        model.register_comm_hook(None, hook if policy else lambda state, bucket: hook(state, bucket))  # renamed)
    train_steps(model, optimizer, torch.Generator().manual_seed(21 + rank), steps)
    out = weights(net)
    release(model, optimizer)
    return out


def comm_hooks(rank: int) -> dict:
    report = {"moved": moved(hook_run(rank, None, None), hook_run(rank, None, None, steps=0))}
    for name, hook in hooks().items():
        ddp = hook_run(rank, None, hook)
        report[name] = {policy: difference(hook_run(rank, policy, hook), ddp) for policy in POLICIES}
        report[name]["wrap"] = difference(hook_run(rank, "prophet", hook, api="wrap"), ddp)
    plain = hook_run(rank, None, None)
    report["fp16_differs_from_none"] = difference(hook_run(rank, None, hooks()["fp16"]), plain)
    return report


def delaying_hook(delay_s: float):
    """The all-reduce hook, its Future completed ``delay_s`` later: a slow link, for certain."""
    import threading

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as d

    def hook(state, bucket):
        reduced = d.allreduce_hook(state, bucket)
        late = torch.futures.Future()
        reduced.then(lambda f: threading.Timer(delay_s, late.set_result, (f.value(),)).start())
        return late
    return hook


def exposure(rank: int) -> dict:
    """Communication the training thread waits for: a hook 40 ms slow per message, against none."""
    report = {}
    for name, hook in (("slow", delaying_hook(0.04)), ("plain", None)):
        for policy in ("fifo", "prophet"):
            torch.manual_seed(0)
            model = gradsched.DistributedDataParallel(Net(), policy=policy, fallback=False)
            if hook is not None:
                model.register_comm_hook(None, hook)
            train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(41 + rank), 12)
            stats = model.stats
            report[f"{name}/{policy}"] = {"iteration_s": stats.iteration_s, "exposed_s": stats.exposed_s,
                                          "share": stats.exposed_share, "messages": stats.plan_messages}
            model.close()
    return report


def powersgd_run(rank: int, policy: str | None, steps: int, options: dict | None = None) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    torch.manual_seed(0)
    net = Net(inputs=32, width=64)  # matrices PowerSGD compresses (min_compression_rate 2 at rank 2)
    if policy is None:
        model = TorchDDP(net)
    else:
        model = gradsched.DistributedDataParallel(net, policy=policy, policy_options=options or {}, fallback=False,
                                                  replan_every=10)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=3)
    if steps:
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(31 + rank)
    teacher = torch.Generator().manual_seed(99)
    target = torch.randn(32, 4, generator=teacher)
    for _ in range(steps):
        x = torch.randn(32, 32, generator=g)
        nn.functional.mse_loss(model(x), x @ target).backward()
        optimizer.step()
        optimizer.zero_grad()
    x = torch.randn(256, 32, generator=teacher)
    with torch.no_grad():
        loss = nn.functional.mse_loss(net(x), x @ target).item()
    out = {"loss": loss, "weights": weights(net), "iterations": state.iter,
           "compressed": state.total_numel_after_compression < state.total_numel_before_compression}
    if policy is not None:
        out["messages"] = model.stats.plan_messages
        model.close()
    return out


def powersgd(rank: int) -> dict:
    steps = 120
    ddp = powersgd_run(rank, None, steps)
    start = powersgd_run(rank, None, 0)
    report = {"start_loss": start["loss"], "ddp_loss": ddp["loss"], "ddp_iterations": ddp["iterations"]}
    for policy in ("fifo", "prophet"):  # fifo: one message, DDP's one bucket
        options = {} if policy == "fifo" else SMALL[policy]
        ours = powersgd_run(rank, policy, steps, options)
        report[policy] = {"loss": ours["loss"], "iterations": ours["iterations"], "compressed": ours["compressed"],
                          "diff": difference(ours["weights"], ddp["weights"]), "messages": ours["messages"]}
    return report


SCENARIOS = {"rng": rng, "accumulate-flag": accumulate_flag, "ignored": ignored, "sparse": sparse, "group": group,
             "subgroups": subgroups, "comm-hooks": comm_hooks, "powersgd": powersgd,
             "exposure": exposure}


def main() -> None:
    out_path, names = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {name: SCENARIOS[name](rank) for name in names}
    finish_with_every_report(out_path, report)


if __name__ == "__main__":
    main()
