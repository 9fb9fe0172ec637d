"""What code written for DDP finds on ``gradsched.DistributedDataParallel`` beyond its own API.

The wrapper is a subclass of PyTorch's ``DistributedDataParallel`` built without DDP's C++
reducer, so it inherits DDP's methods. Those that act on the reducer (or on DDP's own
construction) would fail deep inside DDP's code: each is replaced by one that raises, naming
itself. Reading an attribute only DDP's reducer sets raises an ``AttributeError`` that says so
(an ``AttributeError``, so that ``hasattr`` still answers).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gradsched.runtime.config import Environment
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.torch_private import ddp_ignored

# What DDP's reducer holds, read by some code (named when it is missing here).
REDUCER_STATE = ("reducer", "logger", "modules_buffers", "named_module_buffers", "buffer_hook", "_module_copies",
                 "_lazy_init_ran", "_use_python_reducer", "_delay_all_reduce_all_params", "_comm_hooks",
                 "_has_rebuilt_buckets", "_static_graph_delay_allreduce_enqueued", "_module_parameters")
# DDP's methods kept as they are: they act on what the wrapper has (or are constructors and pickling,
# which the wrapper defines itself).
KEPT = {"_get_active_ddp_module", "_inside_ddp_forward", "_get_data_parallel_params",
        "_set_params_and_buffers_to_ignore_for_model", "scatter", "gather", "to_kwargs", "_distributed_rank", "train",
        "__init__", "__getstate__", "__setstate__"}


def _refused(where: str, name: str) -> Any:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise GradschedError(f"{where}.{name}() is DDP's and acts on DDP's C++ reducer, which gradsched replaces; "
                             "it has no counterpart here")
    refuse.__name__ = name
    return refuse


def refuse_reducer_methods(cls: type, where: str) -> None:
    """Replace every method ``cls`` inherits from PyTorch's DDP and neither defines nor keeps."""
    for name, member in list(vars(torch.nn.parallel.DistributedDataParallel).items()):
        if (callable(member) and not isinstance(member, (staticmethod, classmethod, type)) and not name.startswith("__")
                and name not in KEPT and name not in vars(cls)):
            setattr(cls, name, _refused(where, name))


def missing_attribute(where: str, name: str) -> AttributeError:
    """The error for an attribute the wrapper lacks: what it is, where it is DDP's reducer's."""
    if name in REDUCER_STATE:
        return AttributeError(f"{where} has no attribute {name!r}: it belongs to DDP's C++ reducer, which gradsched "
                              "replaces (see model.stats for what gradsched reports)")
    return AttributeError(f"{where!r} object has no attribute {name!r}")


def set_ddp_attributes(ddp: Any, module: Any, device_ids: list | None, dim: int, process_group: Any,
                       device_mesh: Any, find_unused_parameters: bool, gradient_as_bucket_view: bool,
                       static_graph: bool, bucket_cap_mb: float) -> None:
    """What code written for DDP reads on it, set as DDP sets it."""
    device = next(iter({p.device for p in module.parameters()} or {torch.device("cpu")}))
    ddp.device_ids = [device.index if device.type == "cuda" else device] if device_ids is not None else None
    ddp.output_device = ddp.device_ids[0] if ddp.device_ids else None
    ddp.device, ddp.device_type, ddp.dim = device, device.type, dim
    ddp.process_group = process_group if process_group is not None else dist.group.WORLD
    ddp.device_mesh = device_mesh
    ddp.find_unused_parameters = find_unused_parameters
    ddp.gradient_as_bucket_view, ddp.static_graph = gradient_as_bucket_view, static_graph
    ddp.bucket_bytes_cap = int(bucket_cap_mb * (1 << 20))
    ddp.mixed_precision = None
    ddp.parameters_to_ignore = ddp_ignored(module)
    ddp.use_side_stream_for_tensor_copies = Environment.read().ddp_side_stream
    ddp.is_multi_device_module = False
