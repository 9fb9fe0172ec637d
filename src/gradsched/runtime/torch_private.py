"""Every use gradsched makes of PyTorch's private APIs, each with why no public one does, and a
probe of each by feature (:data:`USES`): a torch that keeps what a use relies on passes, one that
dropped or changed it is refused at the first wrap, naming the use (:func:`require`).
tests/runtime/test_torch_private.py checks that each does what gradsched relies on, on every
torch the project is tested with (:data:`READ_AGAINST`)."""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

#: the PyTorch versions (major.minor) whose source these uses were read against, and CI runs on
READ_AGAINST = ("2.11", "2.13", "2.14")

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
    from torch.distributed.utils import _to_kwargs

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


try:  # torch's pytree (nested lists, tuples and dicts, torch's containers known): no public module exposes it
    from torch.utils._pytree import tree_map
except ImportError:  # named by require()
    tree_map = None


def _has(owner: Any, *names: str) -> bool:
    return all(hasattr(owner, name) for name in names)


def _ddp_ignore_list() -> bool:
    module = nn.Module()  # no parameters: nothing drawn from the user's random generator
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ["bias"])
    return ddp_ignored(module) == {"bias"}


def _version_counter() -> bool:
    t = torch.zeros(2)
    before = version(t)
    t.add_(1)
    return version(t) == before + 1 and _has(torch._C._autograd, "_unsafe_set_version_counter")


def _input_mover() -> bool:
    from torch.distributed.utils import _to_kwargs

    return list(inspect.signature(_to_kwargs).parameters)[:4] == ["inputs", "kwargs", "target_device",
                                                                    "use_side_stream_for_tensor_copies"]


def _grad_scaler_attributes() -> bool:
    from torch.amp import grad_scaler

    source = inspect.getsource(grad_scaler)  # where it sets them on the optimizer
    return all(re.search(rf"optimizer\.{name}\s*=", source) for name in GRAD_SCALER_ATTRIBUTES)


def _default_store() -> bool:
    from torch.distributed import distributed_c10d

    return _has(distributed_c10d, "_get_default_store")


#: each private use, by the function that makes it, and the probe of what it relies on (True: there)
USES: dict[str, Callable[[], bool]] = {
    "backward_running: autograd's current graph task (torch._C._current_graph_task_id)":
        lambda: _has(torch._C, "_current_graph_task_id") and torch._C._current_graph_task_id() == -1,
    "will_be_reached: the engine's answer whether a node runs (torch._C._will_engine_execute_node)":
        lambda: _has(torch._C, "_will_engine_execute_node"),
    "plain_torch_function: torch functions without subclasses (torch._C.DisableTorchFunctionSubclass)":
        lambda: _has(torch._C, "DisableTorchFunctionSubclass"),
    "is_future: the C++ future a backend hands back (torch._C.Future)": lambda: _has(torch._C, "Future"),
    "default_store: the default group's store (distributed_c10d._get_default_store)": _default_store,
    "ddp_ignored: DDP's list of what to leave alone (_ddp_params_and_buffers_to_ignore)": _ddp_ignore_list,
    "move_inputs: DDP's input mover (torch.distributed.utils._to_kwargs)": _input_mover,
    "ddp_pre_forward, ddp_post_forward: DDP's forward halves (_pre_forward, _post_forward, _active_ddp_module)":
        lambda: _has(DistributedDataParallel, "_pre_forward", "_post_forward", "_active_ddp_module"),
    "version, set_versions: autograd's version counters (Tensor._version, _unsafe_set_version_counter)":
        _version_counter,
    "GRAD_SCALER_ATTRIBUTES: what GradScaler sets on a fused optimizer (grad_scale, found_inf)":
        _grad_scaler_attributes,
    "tree_map: torch's pytree (torch.utils._pytree.tree_map)": lambda: tree_map is not None,
}


def missing() -> list[str]:
    """The uses whose probe fails on the installed torch (a probe that raises fails)."""
    failed = []
    for use, probe in USES.items():
        try:
            ok = probe()
        except Exception:  # noqa: BLE001 - any error: what the use relies on is not there
            ok = False
        if not ok:
            failed.append(use)
    return failed


_CHECKED: list[bool] = []


def require() -> None:
    """Raise, naming each use, if the installed torch lacks what one relies on (probed once)."""
    if _CHECKED:
        return
    failed = missing()
    if failed:
        from gradsched.runtime.errors import GradschedError

        raise GradschedError(
            f"torch {torch.__version__} lacks what gradsched uses of its private API (read against torch "
            f"{', '.join(READ_AGAINST)}): " + "; ".join(failed)
            + ". Install a torch in pyproject.toml's range, or report the torch version")
    _CHECKED.append(True)
