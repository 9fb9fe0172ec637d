"""Every use gradsched makes of PyTorch's private APIs, each with why no public one does, pinned
to the PyTorch it was written against (tests/runtime/test_torch_private.py checks each on the
installed version, and fails on another minor version until this module is read again)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from torch.distributed.utils import _to_kwargs
from torch.nn.parallel import DistributedDataParallel

#: the PyTorch these uses were written and checked against (major.minor)
WRITTEN_FOR = "2.13"

#: what ``torch.amp.GradScaler`` sets on a fused optimizer (``fused=True``) for the length of its
#: ``step()`` only, so that the optimizer unscales in its own kernel and skips an overflow:
#: deferred updates keep them (gradsched.runtime.training.updates)
GRAD_SCALER_ATTRIBUTES = ("grad_scale", "found_inf")


def backward_running() -> bool:
    """Whether this thread runs a backward pass (autograd's current graph task). No public API
    says so; a wait for gradients inside one (activation checkpointing re-runs forward passes
    there) must not conclude that no gradient can still come."""
    return torch._C._current_graph_task_id() != -1


def will_be_reached(node: Any) -> bool:
    """Whether the backward pass running on this thread executes autograd ``node``: the
    engine's own answer, which ``torch.autograd.graph.register_multi_grad_hook`` is built on;
    that hook cannot be used on parameters (it makes ``torch.autograd.grad`` with parameters as
    inputs raise)."""
    return torch._C._will_engine_execute_node(node)


def plain_torch_function() -> Any:
    """A context in which torch functions see tensor subclasses as plain tensors: how a
    ``__torch_function__`` override runs the original operation (the pattern PyTorch's own
    subclass examples use)."""
    return torch._C.DisableTorchFunctionSubclass()


def is_future(value: Any) -> bool:
    """Whether ``value`` is a torch future (Python's ``torch.futures.Future`` or the C++ one a
    backend may hand back unwrapped, as DDP accepts from communication hooks)."""
    return isinstance(value, (torch.futures.Future, torch._C.Future))


def default_store() -> Any:
    """The default process group's key-value store (peer status reads and writes it on a
    connection of its own); no public accessor exists."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def ddp_ignored(model: nn.Module) -> set[str]:
    """The names DDP is told to leave alone with its (public, underscored) static method
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``, which keeps them
    in this attribute of the model."""
    return set(getattr(model, "_ddp_params_and_buffers_to_ignore", None) or ())


def move_inputs(args: tuple, kwargs: dict, device: torch.device, side_stream: bool) -> tuple[tuple, dict]:
    """DDP's own input mover (nested containers, dataclasses, on CUDA a side stream): the
    behaviour ``device_ids`` promises, which no public function provides."""
    moved_args, moved_kwargs = _to_kwargs(args, kwargs, device, side_stream)
    return moved_args[0], moved_kwargs[0]


def ddp_pre_forward(ddp: DistributedDataParallel, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """What DDP's ``forward`` does before the module's (prepare the reducer, sync buffers, join),
    run from a forward pre-hook of the user's module, as ``torch.distributed._composable.replicate``
    runs it: after a hand-off the user's module keeps its class (gradsched.runtime.architectures.reducer)."""
    DistributedDataParallel._active_ddp_module = ddp
    return ddp._pre_forward(*args, **kwargs)


def ddp_post_forward(ddp: DistributedDataParallel, output: Any) -> Any:
    """What DDP's ``forward`` does after the module's (find unused parameters, static graph)."""
    DistributedDataParallel._active_ddp_module = None
    return ddp._post_forward(output)


def version(tensor: torch.Tensor) -> int:
    """The count of in-place changes made to ``tensor``'s memory (autograd's version counter):
    how a sharded run with compression tells that someone else (``load_state_dict``, a user's
    ``copy_``) wrote a parameter since its last all-gather, whose master copy must then be
    read again. No public API counts writes."""
    return tensor._version


def set_versions(tensors: Sequence[torch.Tensor], versions: Sequence[int]) -> None:
    """Set autograd's version counters of ``tensors`` back to ``versions``: a fully sharded
    parameter gathered again for its backward pass holds the values its forward pass saved,
    though written anew (FSDP2 keeps its counters the same way). No public API sets them."""
    torch._C._autograd._unsafe_set_version_counter(tuple(tensors), tuple(versions))
