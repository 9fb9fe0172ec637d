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
is *bound* (:mod:`gradsched.runtime.frontend.binding`), with documented ``torch.optim`` hooks
only, so LR schedulers wrapped around ``step()`` before or after keep working.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gradsched.runtime.frontend.binding import Binder, bind_when_it_steps
from gradsched.runtime.frontend.ddp_arguments import buffer_sync, process_group_of, runtime_options
from gradsched.runtime.frontend.ddp_surface import missing_attribute, refuse_reducer_methods, set_ddp_attributes
from gradsched.core.policies import is_buckets
from gradsched.runtime.config import Environment
from gradsched.runtime.errors import GradschedError, entered_through
from gradsched.runtime.comm.broadcast import buffers_of
from gradsched.runtime.training.join import JoinsUnevenInputs, UnevenInputs
from gradsched.runtime.frontend.optimizer import ScheduledOptimizer
from gradsched.runtime.diagnostics.stats import RunStats
from gradsched.runtime.torch_private import move_inputs
from gradsched.runtime.frontend.wrap import start

_WHERE = "gradsched.DistributedDataParallel"

TorchDDP = torch.nn.parallel.DistributedDataParallel


class DistributedDataParallel(TorchDDP, JoinsUnevenInputs):
    """Takes DDP's arguments, and gradsched's after the ``*``.

    It is a :class:`torch.nn.parallel.DistributedDataParallel` (``isinstance`` holds, so
    ``model.module if isinstance(model, DDP) else model`` and the libraries that branch so
    unwrap it) built without DDP's reducer: what code reads on a DDP object (``module``,
    ``device_ids``, ``process_group``, ``require_backward_grad_sync``, ...) is here; the few
    methods of DDP's reducer that have no counterpart raise, naming themselves.

    Args (DDP's, as documented by PyTorch):
        device_ids: ``None`` on CPU, or ``[device]`` where the module is (one device per process):
            tensors in the inputs are moved there before forward, as DDP moves them.
        forward_sync_buffers: copy rank 0's buffers before a forward pass when the one before it
            trained and synced (DDP's ``require_forward_param_sync`` rule); default True.
        broadcast_buffers: the older name of ``forward_sync_buffers``; ``False`` also skips the
            buffers' copy at construction (deprecated where PyTorch deprecates it, with its warning).
        init_sync: copy rank 0's parameters and buffers now (default True; False requires them equal).
        process_group: the ranks that average gradients: any group this rank is in (a subgroup:
            each replica group averages among itself, as DDP's); ``device_mesh``: a 1-D mesh, its group.
        bucket_cap_mb: size of the DDP-style buckets the measured fallback (and ``policy="fifo"``) uses.
        find_unused_parameters: parameters may get no gradient in a backward pass.
        check_reduction, gradient_as_bucket_view, static_graph: accepted, no effect: gradients
            already live in the plan's buffers, and the graph is measured every backward pass.
        output_device, dim: accepted for one device per process, as DDP.

    DDP's calls: ``no_sync()``, ``require_backward_grad_sync = False`` (the same, per forward
    pass), ``register_comm_hook(state, hook)`` (the hook runs on the policy's messages),
    ``join()``, ``_set_params_and_buffers_to_ignore_for_model``; sparse gradients are averaged.

    Wrapping a module again (while an earlier wrapper of it lives, or after) takes over from
    the earlier wrapper, which stops communicating. The wrapper pickles (``torch.save(model)``,
    ``copy.deepcopy``) as DDP's does: every rank must load it, as it attaches anew.

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
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        forward_sync_buffers: bool | None = None,
        device_mesh: Any = None,
        *,
        policy: str | None = None,
        policy_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        nn.Module.__init__(self)  # not DDP's: gradsched reduces, not DDP's reducer
        policy = policy or Environment.read().policy or "bytescheduler"
        with entered_through(_WHERE):
            process_group = process_group_of(process_group, device_mesh)
            options = runtime_options(module, device_ids, output_device, dim, options)
            sync_buffers, init_sync_buffers = buffer_sync(broadcast_buffers, forward_sync_buffers)
            options = dict(options, find_unused_parameters=find_unused_parameters, broadcast_buffers=sync_buffers,
                           broadcast_parameters=init_sync)
            if options.get("servers"):
                raise GradschedError(f"{_WHERE}: parameter servers (architecture='ps') need gradsched.wrap: on a "
                                     "server rank it serves and returns (model, None), which a module's constructor "
                                     "cannot")
            if bucket_cap_mb is not None:
                options["bucket_cap_mb"] = float(bucket_cap_mb)
                if is_buckets(policy):  # its buckets are DDP's: bucket_cap_mb caps them
                    policy_options = {"bucket_cap_bytes": int(bucket_cap_mb * (1 << 20)), **(policy_options or {})}
        self.module = module
        self._arguments = (policy, policy_options, options)  # what a pickled copy attaches with
        set_ddp_attributes(self, module, device_ids, dim, process_group, device_mesh, find_unused_parameters,
                           gradient_as_bucket_view, static_graph, options.get("bucket_cap_mb", 25.0))
        self._comm_hook: tuple[Any, Any] | None = None  # (state, hook), register_comm_hook's
        self._attach(init_sync and init_sync_buffers)

    def _attach(self, sync_buffers: bool) -> None:
        policy, policy_options, options = self._arguments
        with entered_through(_WHERE):
            group = None if self.process_group is dist.group.WORLD else self.process_group
            coordinator = start(self.module, None, policy, policy_options, options, group, self._comm_hook)
        if coordinator is None:  # pragma: no cover - parameter servers were refused above
            raise GradschedError(f"{_WHERE}: a parameter server returned")
        self._binder = Binder(coordinator)
        if sync_buffers and coordinator.run.world_size > 1:
            coordinator.broadcast_buffers()  # DDP copies rank 0's buffers at construction too
        bind_when_it_steps(self._binder)

    @property
    def forward_sync_buffers(self) -> bool:
        """Whether rank 0's buffers are copied before every forward pass that trains (DDP's option)."""
        return self._arguments[2]["broadcast_buffers"]

    @property
    def broadcast_buffers(self) -> bool:
        """The same as :attr:`forward_sync_buffers` (DDP's older name)."""
        return self.forward_sync_buffers

    @property
    def require_backward_grad_sync(self) -> bool:
        """DDP's switch for gradient accumulation: ``False`` before a forward pass makes the
        backward pass after it accumulate locally, exactly as inside ``no_sync()`` (scripts
        set it per micro-step: ``model.require_backward_grad_sync = last_micro_step``)."""
        return self._binder.coordinator.run.sync.backward

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, enabled: bool) -> None:
        self._binder.coordinator.set_backward_sync(enabled)

    @property
    def require_forward_param_sync(self) -> bool:
        """DDP's flag that the next forward pass syncs buffers (set by each forward pass: True
        after one that trained and synced)."""
        return self._binder.coordinator.forward_param_sync()

    @require_forward_param_sync.setter
    def require_forward_param_sync(self, enabled: bool) -> None:
        co = self._binder.coordinator
        co.forward_param_sync(enabled)
        co.run.sync.param = bool(enabled)

    def will_sync_module_buffers(self) -> bool:
        """Whether the next forward pass copies rank 0's buffers (DDP's method)."""
        return bool(self.require_forward_param_sync and self.forward_sync_buffers and buffers_of(self.module))

    # -- pickling, as DDP's wrapper pickles (torch.save(model), copy.deepcopy) -------------------
    def __getstate__(self) -> dict[str, Any]:
        """The module (updated: every pending update applied) and the arguments; no coordinator."""
        self._binder.coordinator.synchronize()
        state = dict(self.__dict__)
        del state["_binder"]
        state.pop("process_group", None)  # as DDP's: a process group does not pickle; loaded on the default one
        state.pop("device_mesh", None)
        state["_comm_hook"] = None  # as DDP's: a hook (and its state's group) is not saved; register it again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Attach a coordinator of its own to the unpickled module (on the default process
        group, as DDP's wrapper does): a collective, so every rank loads it. The parameters are
        not copied from rank 0 again; they must be equal on every rank, as where they were saved."""
        nn.Module.__setstate__(self, state)  # not DDP's: it rebuilds DDP's reducer
        if not (dist.is_available() and dist.is_initialized()):
            raise GradschedError(f"{_WHERE}: unpickling the wrapper attaches it to the default process group, "
                                 "which is not initialized: call torch.distributed.init_process_group(...) first, "
                                 "or save and load model.module (or its state_dict) instead")
        policy, policy_options, options = self._arguments
        self._arguments = (policy, policy_options, dict(options, broadcast_parameters=False))
        self.process_group, self.device_mesh = dist.group.WORLD, None
        self._attach(sync_buffers=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.device_ids:  # as DDP: tensors in the inputs (nested too) moved to the module's device first
            args, kwargs = self._move_inputs(args, kwargs, self.device)
        return self.module(*args, **kwargs)

    def _move_inputs(self, args: tuple, kwargs: dict, device: torch.device) -> tuple[tuple, dict]:
        """DDP's own input mover (on CUDA, on a side stream)."""
        return move_inputs(args, kwargs, device, self.use_side_stream_for_tensor_copies)

    def __getattr__(self, name: str) -> Any:
        try:
            return nn.Module.__getattr__(self, name)
        except AttributeError:
            raise missing_attribute(_WHERE, name) from None

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
        self._binder.coordinator.close()

    # join() and its Joinable parts are gradsched's (gradsched.runtime.training.join), not DDP's
    join = JoinsUnevenInputs.join
    join_hook = JoinsUnevenInputs.join_hook
    join_device = JoinsUnevenInputs.join_device
    join_process_group = JoinsUnevenInputs.join_process_group

    def register_comm_hook(self, state: object, hook: Any) -> None:
        """DDP's: ``hook(state, bucket)`` runs on every message the policy plans, in its order and
        partition, each message buffer handed over as a bucket with ``GradBucket``'s methods (see
        :mod:`gradsched.runtime.comm.comm_hook`: stable bucket indices, and the group the hook
        communicates on). As DDP: every rank, once, before the first backward pass."""
        if not callable(hook):
            raise TypeError(f"{_WHERE}.register_comm_hook: hook must be callable as hook(state, bucket)")
        co = self._binder.coordinator
        if self._comm_hook is not None:
            raise GradschedError(f"{_WHERE}.register_comm_hook: a communication hook is registered already; "
                                 "register one, once (as DDP)")
        if co.round > 0:
            raise GradschedError(f"{_WHERE}.register_comm_hook: register the hook before the first backward pass "
                                 "(as DDP)")
        arguments = self._arguments
        policy, policy_options, options = arguments
        self._comm_hook, self._arguments = (state, hook), (policy, policy_options, dict(options,
                                                                                        broadcast_parameters=False))
        try:
            self._attach(sync_buffers=False)  # every rank: a coordinator whose messages run through the hook
        except BaseException:
            self._comm_hook, self._arguments = None, arguments
            raise

    def _uneven_inputs(self) -> UnevenInputs:
        return self._binder.coordinator.uneven


refuse_reducer_methods(DistributedDataParallel, _WHERE)
