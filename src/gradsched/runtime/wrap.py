"""``gradsched.wrap``: schedule the gradient communication of a model and its optimizer.

>>> model, optimizer = gradsched.wrap(model, optimizer, policy="bytescheduler")  # doctest: +SKIP
>>> for x, y in loader:                                                           # doctest: +SKIP
...     loss_fn(model(x), y).backward()
...     optimizer.step()
...     optimizer.zero_grad()

Run under ``torchrun`` after ``torch.distributed.init_process_group`` (gloo or NCCL).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import sys
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..core import POLICIES, policy_config
from .config import RuntimeConfig
from .coordinator import Coordinator
from .errors import GradschedError, failing_rank
from .optimizer import ScheduledOptimizer
from . import ps
from .server import Server

_WRAPPED: weakref.WeakSet = weakref.WeakSet()
_OPEN: weakref.WeakSet = weakref.WeakSet()  # coordinators, closed at exit if the user did not


@atexit.register
def _close_at_exit() -> None:
    """Stop launcher threads and drop collective callbacks while the interpreter is whole:
    a backend thread entering Python during interpreter shutdown aborts the process."""
    for coordinator in list(_OPEN):
        try:  # wait only if nothing is in flight: a normal end; parameter servers then stop too
            coordinator.close(wait=coordinator.idle())
        except Exception:  # noqa: BLE001 - the process is ending; the peers time out
            pass


def wrap(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: str = "bytescheduler",
    *,
    policy_options: dict[str, Any] | None = None,
    find_unused_parameters: bool = False,
    broadcast_buffers: bool = True,
    broadcast_parameters: bool = False,
    profile_rounds: int = 3,
    replan_every: int = 50,
    timeout: float = 300.0,
    trace: str | None = None,
    fallback: bool = True,
    trial_rounds: int = 5,
    autotune: bool = False,
    autotune_trials: int = 10,
    autotune_space: dict[str, str] | None = None,
    autotune_seed: int = 0,
    architecture: str = "allreduce",
    servers: int = 0,
    exit_server: bool = True,
) -> tuple[nn.Module, ScheduledOptimizer | None]:
    """Schedule ``model``'s gradient communication with ``policy`` and apply ``optimizer``
    per parameter. Returns the same model (with hooks attached) and the optimizer to use.

    Args:
        policy: ``fifo`` (what DDP does), ``priority``, ``bytescheduler`` or ``prophet``.
        policy_options: the policy's options, e.g. ``{"credit_bytes": "8MiB"}``
            (``gradsched models`` lists them).
        find_unused_parameters: allow parameters without a gradient in a backward pass
            (costs one small collective per backward pass, as in DDP).
        broadcast_buffers: copy rank 0's buffers (BatchNorm statistics) before every forward.
        broadcast_parameters: copy rank 0's parameters at wrap time instead of requiring
            identical ones.
        profile_rounds: backward passes measured before the first measured plan.
        replan_every: backward passes between re-planning points (0: never).
        timeout: seconds after which a stuck or dead rank makes the others fail.
        trace: write a Chrome trace of this rank to this path (``.rank{N}`` is inserted)
            when the optimizer is closed.
        fallback: measure the policy against DDP-style buckets (fifo) at the first control
            point, ``trial_rounds`` backward passes each, and keep the buckets unless the
            policy is at least 2% faster: never meaningfully slower than DDP.
        trial_rounds: backward passes per measured arm of that comparison and of the
            tuner's candidates (the first and last of each are not counted).
        autotune: tune the policy's options (partition and credit sizes; Prophet's stage
            threshold) online by Bayesian optimisation: rank 0 proposes ``autotune_trials``
            candidates (your options first), every rank switches at the same step, each
            is measured over ``trial_rounds`` backward passes, the fastest is measured once
            more, and the fastest by the mean of its measurements is kept if it beat your
            options by 2% (otherwise yours stay). ``optimizer.stats["autotune"]`` holds the
            history.
        autotune_space: search ranges, option -> "LOW:HIGH" (e.g. ``{"partition_bytes":
            "256KiB:8MiB"}``), replacing the defaults of :func:`gradsched.tune.default_space`.
        autotune_seed: seed of the tuner's sampler.
        architecture: ``"allreduce"``, or ``"ps"`` for parameter servers: the last
            ``servers`` ranks serve and the others train (see :mod:`gradsched.runtime.ps`).
            On a server rank this call runs the server until the workers close their
            optimizers, destroys the process group and exits the process (status 0), so
            the training loop after it runs on workers only.
        servers: the number of parameter servers (``architecture="ps"`` only).
        exit_server: with ``False``, a server rank returns ``(model, None)`` once the
            workers are done instead of ending the process (to serve several wraps in turn).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise GradschedError(
            "gradsched.wrap needs torch.distributed: call torch.distributed.init_process_group(...) first "
            "(under torchrun: init_process_group('gloo') on CPU, 'nccl' on GPU)"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"gradsched.wrap: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(optimizer, ScheduledOptimizer):
        raise GradschedError("gradsched.wrap: this optimizer is already wrapped")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"gradsched.wrap: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise GradschedError("gradsched.wrap: LBFGS needs a closure over all parameters and cannot update per parameter")
    if model in _WRAPPED:
        raise GradschedError("gradsched.wrap: this model is already wrapped; close the other optimizer first")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from: {', '.join(POLICIES)}")
    config = policy_config(policy, **(policy_options or {}))
    runtime = RuntimeConfig(
        find_unused_parameters=find_unused_parameters, broadcast_buffers=broadcast_buffers,
        broadcast_parameters=broadcast_parameters, profile_rounds=profile_rounds, replan_every=replan_every,
        timeout_s=float(timeout), fallback=fallback, trial_rounds=trial_rounds, trace=trace,
        autotune=autotune, autotune_trials=autotune_trials, autotune_seed=autotune_seed,
        autotune_space=dict(autotune_space) if autotune_space else None, architecture=architecture, servers=servers,
    )

    names, params = _trainable(model)
    known = {id(p) for g in optimizer.param_groups for p in g["params"]}
    stray = [n for n, p in zip(names, params) if id(p) not in known]
    if not params:
        raise GradschedError("gradsched.wrap: the model has no trainable parameters")
    model_ids = {id(p) for p in model.parameters()}
    foreign = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in model_ids)
    if foreign:
        raise GradschedError(f"gradsched.wrap: the optimizer holds {foreign} parameters that are not in the model")

    if runtime.architecture == "ps" and any(p.device.type != "cpu" for p in params):
        raise GradschedError("gradsched.wrap: architecture='ps' moves CPU tensors over gloo for now; "
                             "use architecture='allreduce' for CUDA parameters")
    rank, world = dist.get_rank(), dist.get_world_size()
    wait = timedelta(seconds=runtime.timeout_s)
    if runtime.architecture == "ps":
        worker_ranks, server_ranks = ps.roles(world, runtime.servers)
        groups = {  # every rank creates every group, in the same order
            "control": dist.new_group(worker_ranks, backend="gloo", timeout=wait),
            "data": dist.new_group(timeout=wait),
            "buffers": dist.new_group(worker_ranks, timeout=wait),
            "plans": dist.new_group(backend="gloo", timeout=wait),
        }
        check_group = groups["plans"]
    else:
        worker_ranks, server_ranks = list(range(world)), []
        groups = {
            "control": dist.new_group(backend="gloo", timeout=wait),
            "data": dist.new_group(timeout=wait),
            "buffers": dist.new_group(timeout=wait),
        }
        check_group = groups["control"]
    with failing_rank("gradsched.wrap: checking the ranks against each other"):
        _check_across_ranks(names, params, config.as_dict(), runtime, check_group, world)
    if runtime.broadcast_parameters:
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0, group=groups["data"])
    dtype_of = {n: p.dtype for n, p in zip(names, params)}
    if rank in server_ranks:
        Server(rank, worker_ranks, server_ranks, dtype_of, groups["data"], groups["plans"], runtime.timeout_s).run()
        if not exit_server:
            return model, None
        dist.destroy_process_group()
        sys.exit(0)
    transport = None
    if server_ranks:
        transport = ps.PushPull(groups["data"], groups["plans"], rank, server_ranks, dtype_of, runtime.timeout_s)
    if stray and rank == 0:
        import warnings

        warnings.warn(
            f"gradsched: {len(stray)} trainable parameters are not in the optimizer (e.g. {stray[0]!r}); "
            "their gradients are averaged but they are never updated",
            stacklevel=2,
        )
    coordinator = Coordinator(model, optimizer, names, params, config, runtime, groups, rank, len(worker_ranks),
                              transport)
    _WRAPPED.add(model)
    _OPEN.add(coordinator)
    wrapped = ScheduledOptimizer(optimizer, coordinator)
    weakref.finalize(wrapped, _WRAPPED.discard, model)
    return model, wrapped


def _trainable(model: nn.Module) -> tuple[list[str], list[nn.Parameter]]:
    names, params, seen = [], [], set()
    for name, p in model.named_parameters():  # shared parameters are listed once
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            names.append(name)
            params.append(p)
    return names, params


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_across_ranks(names, params, policy, runtime, group, world) -> None:
    """Same structure, same configuration and (unless broadcast) same values everywhere."""
    structure = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(names, params)]
    with torch.no_grad():
        sums = [(float(p.detach().double().sum()), float(p.detach().double().square().sum())) for p in params]
    mine = {
        "structure": _digest(json.dumps(structure)),
        "config": json.dumps({"policy": policy, "runtime": runtime.fingerprint()}, sort_keys=True),
        "sums": sums,
    }
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    base = everyone[0]
    for other_rank, other in enumerate(everyone):
        if other["structure"] != base["structure"]:
            raise GradschedError(
                f"gradsched.wrap: rank {other_rank} has different parameters (names, shapes or dtypes) "
                "than rank 0: every rank must wrap the same model"
            )
        if other["config"] != base["config"]:
            theirs, ours = json.loads(other["config"]), json.loads(base["config"])
            diffs = [
                f"{part}.{key}={theirs[part].get(key)!r} (rank 0: {ours[part].get(key)!r})"
                for part in ours
                for key in sorted(set(ours[part]) | set(theirs[part]))
                if ours[part].get(key) != theirs[part].get(key)
            ]
            raise GradschedError(
                f"gradsched.wrap: rank {other_rank} passed a different configuration than rank 0: {', '.join(diffs)}"
            )
    if runtime.broadcast_parameters:
        return
    for other_rank, other in enumerate(everyone):
        for name, a, b in zip(names, base["sums"], other["sums"]):
            if a != b:
                raise GradschedError(
                    f"gradsched.wrap: parameter {name!r} differs between rank 0 and rank {other_rank}: seed "
                    "the model identically on every rank, or pass broadcast_parameters=True to copy rank 0's"
                )
