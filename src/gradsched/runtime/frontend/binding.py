"""Binding the optimizer of a model wrapped before it (``gradsched.DistributedDataParallel``).

The first ``torch.optim`` optimizer whose ``step()`` runs over the model's parameters is
*bound*: from then on its ``step()`` schedules (each parameter updated once its gradient is
reduced), its ``zero_grad()`` waits for gradients still on the wire, and its
``state_dict()`` waits for every update. One global optimizer step pre-hook (a documented
``torch.optim`` hook, registered on first use) finds it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gradsched.runtime.errors import GradschedError
from gradsched.runtime.frontend.checks import check_optimizer, stray_parameters, warn_stray
from gradsched.runtime.frontend.optimizer import ScheduledOptimizer
from gradsched.runtime.training.coordinator import Coordinator

_BINDERS: weakref.WeakSet = weakref.WeakSet()  # wrapped models whose optimizer may step
_HOOK = None  # the one global optimizer step pre-hook, registered on first use


class Binder:
    """Finds the optimizer of a model wrapped before it, and routes that optimizer's
    ``step()``, ``zero_grad()`` and checkpoints through the coordinator."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduled: ScheduledOptimizer | None = None
        self._handles: list[Any] = []
        coordinator.on_close.append(self._release)

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
        """The step pre-hook: schedule this step, and let the optimizer's own ``step()`` run on
        none of the parameters gradsched schedules (it still runs any closure, returning its loss)."""
        co = self.coordinator
        if co.closed or co.run.updates.applying:
            return None
        if optimizer is self.optimizer:
            pass
        elif optimizer is self.scheduled or not any(id(p) in co.run.index for g in optimizer.param_groups
                                                    for p in g["params"]):
            return None
        elif self.optimizer is None:
            self._bind(optimizer)
        else:
            raise GradschedError("gradsched: a second optimizer steps this model's parameters; gradsched applies "
                                 "one optimizer per wrapped model: use one optimizer with parameter groups")
        kwargs = dict(kwargs)
        closure = kwargs.pop("closure", args[1] if len(args) > 1 else None)
        loss = self.scheduled.schedule_step(closure, unscheduled=False)  # the optimizer steps the rest itself
        if optimizer._optimizer_step_post_hooks:  # code hooked after step() reads parameters: update them all
            co.synchronize()
        if closure is not None:
            kwargs["closure"] = lambda: loss
        return (_stepping_unscheduled(optimizer, co.run.index),), kwargs

    def _bind(self, optimizer: torch.optim.Optimizer) -> None:
        check_optimizer(optimizer)
        for other in _BINDERS:
            if other is not self and other.optimizer is optimizer:
                raise GradschedError("gradsched: one optimizer steps the parameters of two wrapped models; "
                                     "wrap one model holding both")
        co = self.coordinator
        run = co.run
        stray = stray_parameters(run.model, optimizer, run.names, run.params)
        if run.rank == 0:
            warn_stray(stray)
        co.bind(optimizer)
        self.optimizer = optimizer
        self.scheduled = ScheduledOptimizer(optimizer, co)
        optimizer.zero_grad = self.scheduled.zero_grad  # type: ignore[method-assign]
        self._handles = [optimizer.register_state_dict_pre_hook(lambda opt: co.synchronize()),
                         optimizer.register_load_state_dict_pre_hook(lambda opt, state: co.synchronize())]

    def _release(self) -> None:
        """The coordinator closed (by close(), or a later wrap of the module): let go of the optimizer."""
        _BINDERS.discard(self)
        if self.optimizer is not None:
            self.optimizer.__dict__.pop("zero_grad", None)
            for handle in self._handles:
                handle.remove()


def _stepping_unscheduled(optimizer: torch.optim.Optimizer, scheduled: dict[int, int]) -> torch.optim.Optimizer:
    """A shallow copy of ``optimizer`` whose groups hold none of the ``scheduled`` parameters
    (gradsched updates those itself): its class's ``step()`` runs (closure included) on the
    others only, such as empty parameters, whose gradients are not communicated."""
    stand_in = object.__new__(type(optimizer))
    stand_in.__dict__.update(optimizer.__dict__)
    stand_in.param_groups = [{**group, "params": [p for p in group["params"] if id(p) not in scheduled]}
                             for group in optimizer.param_groups]
    return stand_in


def bind_when_it_steps(binder: Binder) -> None:
    """``binder`` binds the first optimizer that steps its model's parameters."""
    global _HOOK
    _BINDERS.add(binder)
    if _HOOK is None:
        _HOOK = register_optimizer_step_pre_hook(_before_any_step)


def _before_any_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
    for binder in list(_BINDERS):
        result = binder.before_step(optimizer, args, kwargs)
        if result is not None:
            return result
    return None
