"""DDP's reducer as an architecture: handing DDP-style buckets to PyTorch's own reducer.

Where the measured trial keeps DDP-style buckets (:mod:`gradsched.control.arms`), gradsched's
launcher would only add its Python work to what DDP does in C++. With ``handoff`` (the
default) every rank then hands its gradients to a
:class:`torch.nn.parallel.DistributedDataParallel` reducer at the same step, the one after
the decision (every rank reaches it at the same round: a control point), and gradsched's
own hooks stand aside from then on.

The user's objects stay what they are: DDP's pre- and post-forward work (preparing the
reducer, syncing buffers, joining) runs as forward hooks of the user's module, as
``torch.distributed._composable.replicate`` runs it, so ``gradsched.wrap``'s model and
``gradsched.DistributedDataParallel``'s module keep their class, their checkpoints and
their pickling. The optimizer steps every parameter at once (the reduction finished inside
backward, as under DDP); ``no_sync()`` and ``join()`` are DDP's.

DDP is built on gradsched's data group (the user's backend) without the initial broadcast
(the parameters are equal on every rank already), with gradients as views of its buckets
(``gradient_as_bucket_view``: it moves each gradient in, so the run holds one gradient
buffer, as it did on gradsched's plane), with the fallback's bucket size, buffer
sync and unused-parameter search, and with compression, PyTorch's matching hook (gradsched's
equivalent on CPU).
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.training.join import Iteration
from gradsched.runtime.training.run import Run
from gradsched.runtime.comm.broadcast import broadcast_flat, buffers_of
from gradsched.runtime.comm.compression import ddp_hook, wire_dtype
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.training.hooks import Hook
from gradsched.runtime.training.lifecycle import RoundLife
from gradsched.runtime.torch_private import ddp_post_forward, ddp_pre_forward

#: the installed DDP calls the buffer sync before each forward ``forward_sync_buffers`` (2.13+)
DDP_NAMES_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


#: DDP's bucket indices after the hand-off start here: a hook's state kept per index (PowerSGD's
#: error feedback) then starts afresh for DDP's buckets, never meets a gradsched message's of
#: another size under the same index
HANDED_OFF_INDEX_BASE = 1 << 20


class _Renumbered:
    """DDP's bucket as the user's hook sees it after the hand-off: its index moved past every
    index gradsched gave its messages, everything else DDP's."""

    def __init__(self, bucket) -> None:
        self._bucket = bucket

    def index(self) -> int:
        return HANDED_OFF_INDEX_BASE + self._bucket.index()

    def __getattr__(self, name: str):
        return getattr(self._bucket, name)


def _passing(hook):
    """``hook`` under another name (DDP refuses PyTorch's bf16 hooks by name without CUDA and
    NCCL, which gloo on CPU reduces well), given DDP's buckets renumbered (:class:`_Renumbered`)."""

    def passing(state, bucket):  # unannotated: DDP checks annotations against its own classes
        return hook(state, _Renumbered(bucket))

    return passing


class TorchReducer:
    """DDP's reducer over ``model``'s parameters, driven by forward hooks on ``model``."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup, config: RuntimeConfig, life: RoundLife,
                 syncing: bool = True, comm_hook: tuple[Any, Any] | None = None) -> None:
        devices = {p.device for p in model.parameters()}
        device = next(iter(devices))
        buffers = {"forward_sync_buffers" if DDP_NAMES_FORWARD_SYNC else "broadcast_buffers": config.broadcast_buffers}
        self.ddp = DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None, process_group=group,
            bucket_cap_mb=config.bucket_cap_mb, find_unused_parameters=config.find_unused_parameters,
            init_sync=False, gradient_as_bucket_view=True, **buffers)
        wire = wire_dtype(config.compression)
        if comm_hook is not None:  # the user's, its state already on gradsched's data group
            state, hook = comm_hook
            self.ddp.register_comm_hook(state, _passing(hook))
        elif wire is not None:
            self.ddp.register_comm_hook(group, ddp_hook(wire))
        self.sync(syncing)
        self.life = life  # the run's rounds: a forward pass whose backward pass will sync opens one
        self._handles = [model.register_forward_pre_hook(Hook(self.before), with_kwargs=True),
                         model.register_forward_hook(Hook(self._after))]

    def before(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self.life.active_at = time.monotonic()
        if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
            self.life.close()
            self.life.forward()
            self.life.gradient()  # DDP's reducer reduces inside the backward pass to come
        return ddp_pre_forward(self.ddp, args, kwargs)

    def _after(self, module: nn.Module, args: tuple, output: Any) -> Any:
        return ddp_post_forward(self.ddp, output)

    def sync(self, enabled: bool) -> None:
        """Whether backward passes reduce (``no_sync()`` turns it off, as DDP's does)."""
        self.ddp.require_backward_grad_sync = enabled

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.ddp = None


class DDPReducer(Architecture):
    """All-reduce by DDP's own C++ reducer: what all-reduce hands its kept buckets to. Not an
    option a user names; the hand-off swaps it in (:meth:`Architecture.handed_off`)."""

    name = "ddp-reducer"

    def open(self, run: Run) -> ReducerBackend:
        """DDP's reducer over ``run``'s model (the plane before it retired: every reduction
        complete, its buffers let go), the run's rounds counted on."""
        reducer = TorchReducer(run.model, run.topology.data, run.config, run.life, syncing=run.sync.enabled,
                               comm_hook=run.comm_hook)
        return ReducerBackend(reducer, run)


class ReducerBackend:
    """The coordinator's backend from the hand-off on: DDP's reducer reduces inside backward,
    ``step()`` updates every parameter at once, ``no_sync()`` and ``join()`` are DDP's. It holds
    the reducer and borrows the run's record (its optimizer's applier, AMP's scaling kept; what
    the retired plane measured, for ``stats()``)."""

    def __init__(self, reducer: TorchReducer, run: Run) -> None:
        self.reducer = reducer
        self.run = run

    @property
    def uneven(self) -> DistributedDataParallel:
        return self.reducer.ddp  # join(): DDP's own

    joined = False  # DDP's join keeps its own state

    def attach(self) -> None:
        """Nothing: the reducer's hooks are on from its construction."""

    def opened_in_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return self.reducer.before(module, args, kwargs)

    def step(self) -> None:  # DDP's reducer finished every reduction inside backward
        run = self.run
        run.life.close()
        run.life.stepped()
        run.updates.apply_now(range(len(run.params)), run.updates.snapshot())

    def control_point(self, round_index: int) -> None:
        """Nothing: the plans ended with the plane."""

    def synchronize(self) -> None:
        """Nothing: every reduction ended inside ``backward()``."""

    def set_sync(self, enabled: bool) -> None:
        self.reducer.sync(enabled)

    def forward_param_sync(self, enabled: bool | None = None) -> bool:
        if enabled is not None:
            self.reducer.ddp.require_forward_param_sync = bool(enabled)
        return self.reducer.ddp.require_forward_param_sync

    def shadow(self, iteration: Iteration) -> None:
        raise AssertionError("after the hand-off join() is DDP's own")  # never called: the coordinator's join is off

    def broadcast_buffers(self, source: int) -> None:
        """Copy rank ``source``'s buffers to every worker, now (DDP's reducer syncs them before each
        forward pass that trains; this is an explicit copy)."""
        broadcast_flat(buffers_of(self.reducer.ddp.module), source, self.run.topology.data, "broadcasting buffers",
                       self.run.explain)

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        """torch's own: the gradients are reduced inside ``backward()``."""
        return torch.nn.utils.clip_grad_norm_([p for p in self.run.params if p.grad is not None], max_norm,
                                              norm_type, error_if_nonfinite, foreach)

    def clip_value(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {value}")
        torch.nn.utils.clip_grad_value_([p for p in self.run.params if p.grad is not None], value)

    def state_saved(self, state_dict: dict) -> None:
        """Nothing: every rank holds the whole state."""

    def state_loading(self, state_dict: dict) -> None:
        """Nothing: any rank's state loads anywhere, as under DDP."""

    def full_state_dict(self, rank0_only: bool) -> dict:
        return self.run.updates.optimizer.state_dict()

    def idle(self) -> bool:
        return True

    def retire(self) -> None:
        raise AssertionError("DDP's reducer hands off to nothing")  # never called: handed_off() is None

    def close(self, wait: bool) -> None:
        self.reducer.close()

    def stop(self, wait: bool) -> None:
        """Nothing more: the plane stopped at the hand-off; DDP (and through it the model) is let go at close."""
