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
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gradsched.core import POLICIES, policy_config
from gradsched.runtime.frontend.checks import (check_across_ranks, check_arguments, check_comm_hook, check_optimizer, check_options,
                     check_parameters, ignored, stray_parameters, trainable, warn_stray)
from gradsched.runtime.comm.comm_hook import hook_state
from gradsched.runtime.training.sparse import sparse_parameters
from gradsched.runtime.comm.compression import check_backend, check_compressible
from gradsched.runtime.architectures.choice import choose
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.training.coordinator import Coordinator
from gradsched.runtime.training.run import Run
from gradsched.runtime.errors import GradschedError, entry, failing_rank
from gradsched.runtime.frontend.optimizer import ScheduledOptimizer
from gradsched.runtime.diagnostics.peer_status import stop_all
from gradsched.runtime.comm.topology import Topology, destroy_created

_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> weakref to its coordinator
_OPEN: weakref.WeakSet = weakref.WeakSet()  # coordinators, closed at exit if the user did not


@atexit.register
def _close_at_exit() -> None:
    """Stop launcher threads, drop collective callbacks and destroy gradsched's process groups
    while the interpreter is whole: a backend thread entering Python during interpreter
    shutdown aborts the process."""
    for coordinator in list(_OPEN):
        try:  # wait only if nothing is in flight: a normal end; parameter servers then stop too
            coordinator.close(wait=coordinator.idle())
        except Exception:  # noqa: BLE001 - the process is ending; the peers time out
            pass
    stop_all()
    destroy_created()


def wrap(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: str = "bytescheduler",
    *,
    policy_options: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
    comm_hook: tuple[Any, Callable] | None = None,
    **options: Any,
) -> tuple[nn.Module, ScheduledOptimizer | None]:
    """Schedule ``model``'s gradient communication with ``policy`` and apply ``optimizer``
    per parameter. Returns the same model (with hooks attached) and the optimizer to use.

    Args:
        policy: ``fifo`` (what DDP does), ``priority``, ``bytescheduler`` or ``prophet``.
        policy_options: the policy's options, e.g. ``{"credit_bytes": "8MiB"}``
            (``gradsched models`` lists them).
        process_group: the ranks that average their gradients (default: every rank), as
            DDP's option: a group over every rank, or a subgroup (each replica group then trains
            its own copy; every member wraps, the other ranks need not at the same time).
        comm_hook: ``(state, hook)``, a DDP communication hook run on every message the policy
            plans, as ``DistributedDataParallel.register_comm_hook(state, hook)`` runs it
            (:mod:`gradsched.runtime.comm.comm_hook`).
        **options: any field of :class:`gradsched.runtime.RuntimeConfig`, where each is
            documented: ``find_unused_parameters``, ``broadcast_buffers``,
            ``broadcast_parameters``, ``profile_rounds``, ``replan_every``, ``fallback``,
            ``fallback_gain``, ``bucket_cap_mb``, ``trial_rounds``, ``autotune``, ``autotune_trials``,
            ``autotune_seed``, ``autotune_space``, ``architecture``, ``servers``,
            ``timeout``, ``trace``.

    With ``architecture="ps"``, on a server rank this call serves until the workers close
    their optimizers and then returns ``(model, None)``: the script decides what the process
    does next (``if optimizer is None: return``, say), as it never trains there.
    """
    check_optimizer(optimizer)
    coordinator = start(model, optimizer, policy, policy_options, options, process_group, comm_hook)
    if coordinator is None:  # a parameter server, done serving
        return model, None
    return model, ScheduledOptimizer(optimizer, coordinator)


def start(model: nn.Module, optimizer: torch.optim.Optimizer | None, policy: str,
          policy_options: dict[str, Any] | None, options: dict[str, Any],
          process_group: dist.ProcessGroup | None = None,
          comm_hook: tuple[Any, Callable] | None = None) -> Coordinator | None:
    """Check everything, agree with the other ranks and attach a coordinator to ``model``
    (applying ``optimizer``, or, if None, the one bound later). On a parameter server:
    serve until the workers are done, then return None.

    A model wrapped before is taken over, as DDP lets a module be wrapped again: the earlier
    coordinator finishes its communication and detaches (what it returned then raises if used)."""
    check_arguments(model)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from: {', '.join(POLICIES)}")
    scheduling = policy_config(policy, **(policy_options or {}))
    config = RuntimeConfig.from_options(options)
    architecture = choose(config)
    check_options(policy, config)
    check_comm_hook(comm_hook, config, architecture)
    if optimizer is not None:
        architecture.check_optimizer(optimizer)
    names, params = trainable(model)
    check_parameters(params, config, architecture)
    check_compressible(config.compression, names, params)
    stray = stray_parameters(model, optimizer, names, params) if optimizer is not None else []
    _take_over(model)
    topology = Topology.create(config, process_group, servers=architecture.servers,
                               tensors=architecture.hands_out_dtensors, gathers=architecture.gathers_parameters)
    with failing_rank(f"{entry()}: checking the ranks against each other"):
        check_across_ranks(names, params, scheduling.as_dict(), config, topology.everyone)
    if not topology.servers:  # all-reduce (servers move point to point); the same compression everywhere
        check_backend(config.compression, topology.data, params[0].device)
    sparse = sparse_parameters(model, ignored(model))
    if config.broadcast_parameters:
        with torch.no_grad():
            for p in params + sparse[1]:
                dist.broadcast(p.data, group_src=0, group=topology.data)
    if topology.is_server:
        architecture.serve(model, names, params, config, topology)
        return None
    if topology.rank == 0:
        warn_stray(stray)
    if comm_hook is not None:
        comm_hook = (hook_state(comm_hook[0], topology.data, process_group), comm_hook[1])
    run = Run.open(model, optimizer, names, params, scheduling, config, topology, sparse, comm_hook, entry())
    coordinator = Coordinator(run, architecture)
    _ATTACHED[model] = weakref.ref(coordinator)
    _OPEN.add(coordinator)
    return coordinator


def _take_over(model: nn.Module) -> None:
    """Close the coordinator an earlier wrap attached to ``model``, if it is still open (every
    rank wraps again at the same point of its program, so what it waits for completes)."""
    ref = _ATTACHED.pop(model, None)
    previous = ref() if ref is not None else None
    if previous is None or previous.closed:
        return
    previous.replaced = True
    try:
        previous.close()
    except GradschedError:  # its last round can never complete (a parameter got no gradient): dropped
        previous.close(wait=False)
