"""What ``gradsched.wrap`` checks before it attaches anything: its arguments, and that every
rank wraps the same model with the same configuration."""

from __future__ import annotations

import json
import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradsched.files import problem_writing
from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.errors import GradschedError, entry
from gradsched.runtime.frontend.optimizer import ScheduledOptimizer
from gradsched.runtime.training.sparse import sparse_parameters
from gradsched.runtime import torch_private
from gradsched.runtime.torch_private import ddp_ignored
from gradsched.runtime.comm import wire_format
from gradsched.runtime.comm.wire_format import RankChecks


def check_arguments(model: nn.Module) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise GradschedError(
            f"{entry()} needs torch.distributed: call torch.distributed.init_process_group(...) first "
            "(under torchrun: init_process_group('gloo') on CPU, 'nccl' on GPU)"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"{entry()}: model must be a torch.nn.Module, got {type(model).__name__}")
    torch_private.require()  # the installed torch has what gradsched's private uses rely on


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if isinstance(optimizer, ScheduledOptimizer):
        raise GradschedError(f"{entry()}: this optimizer is already wrapped")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{entry()}: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise GradschedError(f"{entry()}: LBFGS needs a closure over all parameters and cannot update per parameter")


def check_options(policy: str, config: RuntimeConfig) -> None:
    """What the options cannot check alone, checked on every rank before any collective:
    the trace file can be written (not found out at ``close()``, after the whole run), and
    online tuning has something to tune, in a valid search space."""
    if config.trace:
        problem = problem_writing(config.trace)
        if problem:
            raise ValueError(f"{entry()}: trace={config.trace!r} {problem}")
    if config.autotune_space is not None and not config.autotune:
        raise ValueError(f"{entry()}: autotune_space is set but autotune is not; pass autotune=True to tune online")
    if config.autotune:
        from gradsched.extras import require
        from gradsched.tune.space import default_space  # not gradsched.tune: that loads Optuna

        require("optuna", "tune")  # now, not at the first control point

        try:
            default_space(policy, config.autotune_space)
        except ValueError as exc:
            raise ValueError(f"{entry()}(autotune=True): {exc}") from None


def ignored(model: nn.Module) -> set[str]:
    """The names of parameters and buffers DDP leaves alone: those set with
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)``
    (neither copied from rank 0, nor reduced, nor synced: each rank keeps its own)."""
    return ddp_ignored(model)


def check_comm_hook(comm_hook: Any, config: RuntimeConfig, architecture: Architecture) -> None:
    """A DDP communication hook: ``(state, hook)``, on all-reduce, without gradsched's compression."""
    if comm_hook is None:
        return
    if not (isinstance(comm_hook, tuple) and len(comm_hook) == 2 and callable(comm_hook[1])):
        raise TypeError(f"{entry()}: comm_hook must be (state, hook) with a callable hook(state, bucket)")
    if architecture.comm_hook_refusal is not None:
        raise GradschedError(f"{entry()}: a communication hook runs on all-reduce messages; with "
                             f"{architecture!r} {architecture.comm_hook_refusal}")
    if config.compression is not None:
        raise GradschedError(f"{entry()}: compression={config.compression!r} and a communication hook both decide "
                             "what travels: use one (PyTorch's bf16_compress_hook/fp16_compress_hook are "
                             "compression as a hook)")


def trainable(model: nn.Module) -> tuple[list[str], list[nn.Parameter]]:
    """Names and parameters whose gradients are communicated in gradsched's messages, each
    shared parameter once: those that get gradients, but not the empty ones (a layer of zero
    features), which hold nothing to average, nor those DDP is told to ignore, nor those
    with sparse gradients (:mod:`gradsched.runtime.training.sparse` reduces those)."""
    skip = ignored(model)
    _, sparse = sparse_parameters(model, skip)
    names, params, seen = [], [], {id(p) for p in sparse}
    for name, p in model.named_parameters():
        if p.requires_grad and p.numel() > 0 and id(p) not in seen and name not in skip:
            seen.add(id(p))
            names.append(name)
            params.append(p)
    return names, params


def check_parameters(params: Sequence[nn.Parameter], config: RuntimeConfig, architecture: Architecture) -> None:
    """Raise for trainable parameters gradsched cannot communicate, and for what the
    architecture refuses (said at the wrap rather than found later)."""
    if not params:
        raise GradschedError(f"{entry()}: the model has no trainable parameters")
    refused = architecture.refusals(params, config, str(dist.get_backend()))
    if refused:
        raise GradschedError(f"{entry()}: {refused[0]}")


def stray_parameters(model: nn.Module, optimizer: torch.optim.Optimizer, names: Sequence[str],
                     params: Sequence[nn.Parameter]) -> list[str]:
    """Raise if the optimizer holds parameters outside the model; return the trainable
    parameters it lacks."""
    model_ids = {id(p) for p in model.parameters()}
    foreign = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in model_ids)
    if foreign:
        raise GradschedError(f"{entry()}: the optimizer holds {foreign} parameters that are not in the model")
    known = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return [n for n, p in zip(names, params) if id(p) not in known]


def warn_stray(stray: Sequence[str]) -> None:
    if stray:
        warnings.warn(
            f"gradsched: {len(stray)} trainable parameters are not in the optimizer (e.g. {stray[0]!r}); "
            "their gradients are averaged but they are never updated",
            stacklevel=3,
        )


def check_across_ranks(names: Sequence[str], params: Sequence[nn.Parameter], policy: dict[str, Any],
                       config: RuntimeConfig, group: dist.ProcessGroup) -> None:
    """Same structure, same configuration and (unless broadcast) same values everywhere."""
    structure = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(names, params)]
    sums = [value_sums(p) for p in params]
    mine = RankChecks(structure, json.dumps({"policy": policy, "runtime": config.fingerprint()}, sort_keys=True), sums)
    everyone = wire_format.all_gather("checks", mine, group)  # each decoded, this rank's too
    base = everyone[0]
    for other_rank, other in enumerate(everyone):
        if other.structure != base.structure:
            raise GradschedError(
                f"{entry()}: rank {other_rank} has different parameters than rank 0 "
                f"({_structure_difference(base.structure, other.structure, other_rank)}): every rank must "
                "wrap the same model"
            )
        if other.config != base.config:
            raise GradschedError(f"{entry()}: rank {other_rank} passed a different configuration than rank 0: "
                                 f"{_differences(json.loads(base.config), json.loads(other.config))}")
    if config.broadcast_parameters:
        return
    for other_rank, other in enumerate(everyone):
        for name, a, b in zip(names, base.sums, other.sums):
            if a != b:
                raise GradschedError(
                    f"{entry()}: parameter {name!r} differs between rank 0 and rank {other_rank}: seed "
                    "the model identically on every rank, or pass broadcast_parameters=True to copy rank 0's"
                )


def value_sums(p: torch.Tensor, chunk: int = 1 << 20) -> tuple[float, float]:
    """The sum of ``p``'s values and of their squares, in double precision, ``chunk`` elements
    at a time: a double copy of a whole parameter (and of its square) would be three times its
    memory at once, at wrap time, before anything else is held (VGG-16's first linear layer:
    1.6 GB, the run's peak under sharding).

    >>> value_sums(torch.tensor([1.0, 2.0, 3.0]), chunk=2)
    (6.0, 14.0)
    """
    total = squares = 0.0
    with torch.no_grad():
        for part in p.detach().reshape(-1).split(chunk):
            part = part.double()
            total += float(part.sum())
            squares += float(part.square().sum())
    return total, squares


def _structure_difference(base: list, other: list, rank: int) -> str:
    """The first parameter whose name, shape or dtype differ, in words."""
    for (name, shape, dtype), (other_name, other_shape, other_dtype) in zip(base, other):
        if name != other_name:
            return f"{name!r} on rank 0 where rank {rank} has {other_name!r}"
        if (list(shape), dtype) != (list(other_shape), other_dtype):
            return (f"{name!r} is {tuple(shape)} {dtype} on rank 0 and {tuple(other_shape)} {other_dtype} "
                    f"on rank {rank}")
    return f"{len(base)} trainable parameters on rank 0, {len(other)} on rank {rank}"


def _differences(ours: dict[str, dict], theirs: dict[str, dict]) -> str:
    return ", ".join(
        f"{part}.{key}={theirs[part].get(key)!r} (rank 0: {ours[part].get(key)!r})"
        for part in ours
        for key in sorted(set(ours[part]) | set(theirs[part]))
        if ours[part].get(key) != theirs[part].get(key)
    )
