"""DDP's constructor arguments, as ``gradsched.DistributedDataParallel`` takes them: checked
against what gradsched supports, and turned into gradsched's options."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradsched.runtime.errors import GradschedError
from gradsched.runtime.architectures.reducer import DDP_NAMES_FORWARD_SYNC

_WHERE = "gradsched.DistributedDataParallel"

# DDP options with no counterpart here; each must keep DDP's default.
_UNSUPPORTED = {
    "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None,
    "mixed_precision": None,
    "skip_all_reduce_unused_params": False,
    "bucket_cap_mb_list": None,
    "batched_grad_copy": False,
}
def buffer_sync(broadcast_buffers: bool | None, forward_sync_buffers: bool | None) -> tuple[bool, bool]:
    """(sync buffers before each forward pass that trains, sync them at construction), as DDP
    decides them: ``forward_sync_buffers`` wins and leaves the construction's sync on; the older
    ``broadcast_buffers=False`` turns both off; both default to True. Where the installed
    PyTorch deprecates ``broadcast_buffers`` (2.13), passing it warns as DDP does."""
    if broadcast_buffers is not None and _DDP_DEPRECATES_BROADCAST_BUFFERS:
        both = forward_sync_buffers is not None
        warnings.warn(f"{_WHERE}: `broadcast_buffers` is deprecated, as in PyTorch's DDP: use `forward_sync_buffers`"
                      + (" (given too, it wins)" if both else "; unlike broadcast_buffers=False, forward_sync_buffers"
                         "=False still copies rank 0's buffers at construction"), FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return bool(forward_sync_buffers), True
    sync = broadcast_buffers is not False
    return sync, sync


_DDP_DEPRECATES_BROADCAST_BUFFERS = DDP_NAMES_FORWARD_SYNC


def process_group_of(process_group: Any, device_mesh: Any) -> Any:
    """DDP's ``process_group`` or ``device_mesh`` (a 1-D mesh: its group), checked; None: the default group."""
    if device_mesh is not None:
        if process_group is not None:
            raise GradschedError(f"{_WHERE}: pass process_group or device_mesh, not both (as DDP)")
        if device_mesh.ndim != 1:
            raise GradschedError(f"{_WHERE}: device_mesh must be 1-D (one group that averages gradients), got a "
                                 f"{device_mesh.ndim}-D mesh; pass its data-parallel dimension: mesh['dp']")
        process_group = device_mesh.get_group()
    if process_group is None or process_group is dist.group.WORLD:
        return None
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"{_WHERE}: process_group must be a torch.distributed.ProcessGroup, "
                        f"got {type(process_group).__name__}")
    return process_group


def runtime_options(module: nn.Module, device_ids: list | None, output_device: Any, dim: int,
                     options: dict[str, Any]) -> dict[str, Any]:
    """Check DDP's arguments; return the keyword options that are gradsched's."""
    where = _WHERE
    for name, default in _UNSUPPORTED.items():
        if name in options and options[name] is not default:
            raise GradschedError(f"{where}: DDP's option {name}= is not supported")
    options = {k: v for k, v in options.items() if k not in _UNSUPPORTED}  # the rest: RuntimeConfig checks them
    if dim != 0:
        raise GradschedError(f"{where}: dim={dim} (scattering inputs over several devices) is not supported")
    devices = {p.device for p in module.parameters()}
    for name, given in (("device_ids", device_ids), ("output_device", output_device)):
        if given is None:
            continue
        listed = list(given) if isinstance(given, (list, tuple)) else [given]
        wanted = {torch.device(d) if not isinstance(d, int) else torch.device("cuda", d) for d in listed}
        if len(listed) != 1 or wanted != devices:
            raise GradschedError(f"{where}: {name}={given!r} must name the one device the module is on "
                                 f"({', '.join(map(str, sorted(devices, key=str)))}), as one process per device")
    return options
