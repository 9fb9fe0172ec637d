"""``gradsched.DistributedDataParallel``: gradsched in the place of PyTorch's DDP.

A script written for ``torch.nn.parallel.DistributedDataParallel`` switches by changing the
one line that wraps the model::

    model = DDP(model, device_ids=[rank])                                           # before
    model = gradsched.DistributedDataParallel(model, device_ids=[rank], policy="prophet")  # after

and keeps every other line: the optimizer built afterwards from ``model.parameters()``, LR
schedulers, ``model.no_sync()``, ``model.join()`` for uneven inputs, ``model.module``,
checkpoints (``state_dict()`` keys start with ``module.``, as DDP's, so DDP checkpoints load
here and these load into DDP), ``optimizer.step(closure)``, AMP's ``GradScaler`` and
``clip_grad_norm_(model.parameters())``.

The model is wrapped before its optimizer exists, so the optimizer is found when it first
steps: the first ``torch.optim`` optimizer whose ``step()`` runs over this model's parameters
is *bound*. From then on its ``step()`` schedules (each parameter is updated once its gradient
is reduced, by the optimizer's own ``step()`` run on that parameter), its ``zero_grad()``
waits for gradients still on the wire, and its ``state_dict()`` waits for every update.
Binding takes nothing but documented ``torch.optim`` hooks, so LR schedulers wrapped
around ``step()`` before or after keep working.
"""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .checks import check_optimizer, stray_parameters, warn_stray
from .coordinator import Coordinator
from .errors import GradschedError
from .join import JoinsUnevenInputs, UnevenInputs
from .optimizer import ScheduledOptimizer
from .stats import RunStats
from .wrap import _WRAPPED, start

# DDP options with no counterpart here; each must keep DDP's default.
_UNSUPPORTED = {
    "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None,
    "mixed_precision": None,
    "device_mesh": None,
    "skip_all_reduce_unused_params": False,
    "bucket_cap_mb_list": None,
    "batched_grad_copy": False,
    "forward_sync_buffers": None,
}
_BINDERS: weakref.WeakSet = weakref.WeakSet()  # wrapped models whose optimizer may step
_HOOK = None  # the one global optimizer step pre-hook, registered on first use


class DistributedDataParallel(nn.Module, JoinsUnevenInputs):
    """Takes DDP's arguments, and gradsched's after the ``*``.

    Args (DDP's, as documented by PyTorch):
        device_ids: ``None`` on CPU, or ``[device]`` where the module is (one device per process).
        broadcast_buffers: copy rank 0's buffers before every forward pass (default True).
        init_sync: copy rank 0's parameters and buffers now (default True; False requires them equal).
        process_group: only the default group.
        bucket_cap_mb: size of the DDP-style buckets the measured fallback (and ``policy="fifo"``) uses.
        find_unused_parameters: parameters may get no gradient in a backward pass.
        check_reduction, gradient_as_bucket_view, static_graph: accepted, no effect: gradients
            already live in the plan's buffers, and the graph is measured every backward pass.
        output_device, dim: accepted for one device per process, as DDP.

    gradsched's:
        policy: as :func:`gradsched.wrap`; by default the environment variable ``GRADSCHED_POLICY``,
            else ``bytescheduler`` (so a launch can choose it without editing the script).
        policy_options: as :func:`gradsched.wrap`.
        **options: any other :class:`gradsched.runtime.RuntimeConfig` field (``fallback``,
            ``autotune``, ``architecture``/``servers``, ``timeout``, ``trace``...).
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: list | None = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool | None = True,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        policy: str | None = None,
        policy_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        policy = policy or os.environ.get("GRADSCHED_POLICY") or "bytescheduler"
        options = _runtime_options(module, device_ids, output_device, dim, process_group, options)
        options = dict(options, find_unused_parameters=find_unused_parameters,
                       broadcast_buffers=broadcast_buffers is not False, broadcast_parameters=init_sync)
        if bucket_cap_mb is not None:
            options["bucket_cap_mb"] = float(bucket_cap_mb)
            if policy == "fifo":
                policy_options = {"bucket_cap_bytes": int(bucket_cap_mb * (1 << 20)), **(policy_options or {})}
        if options.get("exit_server") is False:
            raise ValueError("gradsched.DistributedDataParallel: exit_server=False is for gradsched.wrap; here a "
                             "parameter server ends its process once the workers are done")
        self.module = module
        # on a parameter server rank (architecture="ps"), start() serves and ends the process
        coordinator = start(module, None, policy, policy_options, options)
        if coordinator is None:  # pragma: no cover - exit_server=False was refused above
            raise GradschedError("gradsched.DistributedDataParallel: a parameter server returned")
        self._binder = _Binder(coordinator)
        if init_sync and coordinator.world_size > 1:
            coordinator.broadcast_buffers()  # DDP copies rank 0's buffers at construction too
        _BINDERS.add(self._binder)
        _register_hook()
        weakref.finalize(self, _WRAPPED.discard, module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the next one outside
        communicates the sum (DDP's ``no_sync``)."""
        with self._binder.coordinator.no_sync():
            yield

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``Module.zero_grad``, but a gradient still on the wire, or not yet applied by the
        optimizer, is cleared only once that is done."""
        self._binder.coordinator.zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """See :meth:`gradsched.ScheduledOptimizer.clip_grad_norm_`: waits for every reduction."""
        return self._binder.coordinator.clip_grad_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_grad_value_(self, clip_value: float) -> None:
        """See :meth:`gradsched.ScheduledOptimizer.clip_grad_value_`: waits for nothing."""
        self._binder.coordinator.clip_grad_value(clip_value)

    def synchronize(self) -> None:
        """Wait for all communication and apply every pending update."""
        self._binder.coordinator.synchronize()

    def export_profile(self, path: str, name: str = "measured") -> str:
        """See :meth:`gradsched.ScheduledOptimizer.export_profile`."""
        return self._binder.coordinator.export_profile(path, name)

    @property
    def stats(self) -> RunStats:
        return self._binder.coordinator.stats()

    @property
    def optimizer(self) -> ScheduledOptimizer | None:
        """The view of the bound optimizer gradsched steps (None before it first stepped)."""
        return self._binder.scheduled

    def close(self) -> None:
        """Finish communication, detach every hook and release the bound optimizer."""
        self._binder.close()
        _WRAPPED.discard(self.module)

    def register_comm_hook(self, state: object, hook: Any) -> None:
        raise GradschedError("gradsched.DistributedDataParallel takes no DDP communication hook: gradsched "
                             "schedules the communication itself")

    def _uneven_inputs(self) -> UnevenInputs:
        return self._binder.coordinator.uneven


class _Binder:
    """Finds the optimizer of a model wrapped before it, and routes that optimizer's
    ``step()``, ``zero_grad()`` and checkpoints through the coordinator."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduled: ScheduledOptimizer | None = None
        self._handles: list[Any] = []

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
        """The step pre-hook: schedule this step, and let the optimizer's own ``step()``
        run on none of the model's parameters (it still runs any closure, returning its loss)."""
        co = self.coordinator
        if co._closed or co.updates.applying:
            return None
        if optimizer is self.optimizer:
            pass
        elif optimizer is self.scheduled or not any(id(p) in co.index for g in optimizer.param_groups
                                                    for p in g["params"]):
            return None
        elif self.optimizer is None:
            self._bind(optimizer)
        else:
            raise GradschedError("gradsched: a second optimizer steps this model's parameters; gradsched applies "
                                 "one optimizer per wrapped model: use one optimizer with parameter groups")
        kwargs = dict(kwargs)
        closure = kwargs.pop("closure", args[1] if len(args) > 1 else None)
        loss = self.scheduled.step(closure)
        if optimizer._optimizer_step_post_hooks:  # code hooked after step() reads parameters: update them all
            co.synchronize()
        if closure is not None:
            kwargs["closure"] = lambda: loss
        return (_stepping_nothing(optimizer),), kwargs

    def _bind(self, optimizer: torch.optim.Optimizer) -> None:
        check_optimizer(optimizer)
        for other in _BINDERS:
            if other is not self and other.optimizer is optimizer:
                raise GradschedError("gradsched: one optimizer steps the parameters of two wrapped models; "
                                     "wrap one model holding both")
        co = self.coordinator
        stray = stray_parameters(co.model, optimizer, co.names, co.params)
        if co.rank == 0:
            warn_stray(stray)
        co.bind(optimizer)
        self.optimizer = optimizer
        self.scheduled = ScheduledOptimizer(optimizer, co)
        optimizer.zero_grad = self.scheduled.zero_grad  # type: ignore[method-assign]
        self._handles = [optimizer.register_state_dict_pre_hook(lambda opt: co.synchronize()),
                         optimizer.register_load_state_dict_pre_hook(lambda opt, state: co.synchronize())]

    def close(self) -> None:
        self.coordinator.close()
        _BINDERS.discard(self)
        if self.optimizer is not None:
            self.optimizer.__dict__.pop("zero_grad", None)
            for handle in self._handles:
                handle.remove()


def _stepping_nothing(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A shallow copy of ``optimizer`` whose groups hold no parameters: its class's ``step()``
    runs (closure included) and updates nothing."""
    stand_in = object.__new__(type(optimizer))
    stand_in.__dict__.update(optimizer.__dict__)
    stand_in.param_groups = [{**group, "params": []} for group in optimizer.param_groups]
    return stand_in


def _register_hook() -> None:
    global _HOOK
    if _HOOK is None:
        _HOOK = register_optimizer_step_pre_hook(_before_any_step)


def _before_any_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
    for binder in list(_BINDERS):
        result = binder.before_step(optimizer, args, kwargs)
        if result is not None:
            return result
    return None


def _runtime_options(module: nn.Module, device_ids: list | None, output_device: Any, dim: int,
                     process_group: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Check DDP's arguments; return the keyword options that are gradsched's."""
    where = "gradsched.DistributedDataParallel"
    for name, default in _UNSUPPORTED.items():
        if name in options and options[name] is not default:
            raise GradschedError(f"{where}: DDP's option {name}= is not supported")
    options = {k: v for k, v in options.items() if k not in _UNSUPPORTED}  # the rest: RuntimeConfig checks them
    if process_group is not None and process_group is not dist.group.WORLD:
        raise GradschedError(f"{where}: only the default process group is supported (process_group=None)")
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
