"""The training thread's side of the architectures that leave every rank a whole copy of the
averaged gradients (all-reduce, parameter servers): the user's optimizer runs on every rank,
on whole parameters, each updated once its own reduction is complete (the Dependency Proxy).

* ``step()``: under a plan that waits at the barrier (DDP-style buckets), every reduction
  first, then every update at once, as DDP does; otherwise every parameter holding a gradient
  is marked pending (:class:`~gradsched.runtime.training.updates.DeferredUpdates`) and updated
  where nothing must be waited for, the rest in the forward pass of the module that reads it;
* a module's forward pass waits for its own parameters' updates only;
* clipping works on the handed-over gradients (:class:`~gradsched.runtime.training.inflight.Handover`).

Memory: the gradients live in the plan's flat buffers (their homes), one copy per rank.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import torch

from gradsched.core.plan import Plan
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.waits import ModuleWaits
from gradsched.runtime.training.updates import DeferredUpdates, Snapshot


class ReplicatedStepping:
    def __init__(self, handover: Handover, updates: DeferredUpdates) -> None:
        self.handover = handover
        self.updates = updates
        self.everything = range(len(updates.params))

    def attach(self, params: Sequence[torch.Tensor], waits: ModuleWaits) -> list[Any]:
        """.grad is the reduced gradient itself: autograd accumulates into it as under DDP, once
        what the user called on it before is applied (a graph made before ``step()`` and
        backpropagated after it, with no forward pass between to apply the step)."""
        return [p.register_hook(partial(self._before_accumulating, i)) for i, p in enumerate(params)]

    def _before_accumulating(self, i: int, grad: torch.Tensor) -> None:
        """Autograd is about to add to ``.grad``: what waits for it first (a step queued; the
        reduction of a later backward pass's forward pass, which then adds to the average)."""
        if self.updates.pending(i) or i in self.handover.unsettled:
            self.updates.touch(i)

    def local_gradient(self, i: int) -> None:
        """Nothing: autograd added a backward pass's gradient that does not communicate to ``.grad``."""

    def accumulated(self, i: int) -> None:
        """Nothing more: autograd added a later backward pass's gradient onto the reduced one."""

    def close(self, wait: bool) -> None:
        """Nothing: the parameters are the model's own throughout."""

    def step(self, snapshot: Snapshot, plan: Plan, reduced: bool) -> None:
        if not plan.cross_barrier:  # like DDP: wait, then update all
            self.updates.wait_and_apply(self.everything, "all parameters")
            self.updates.apply_now(self.everything, snapshot)
            return
        # every gradient the optimizer would see, as DDP's does: one no rank used in the latest
        # backward pass is updated with what it held before (an earlier pass's, accumulated)
        with_grad = [i for i, p in enumerate(self.updates.params) if p.grad is not None]
        self.updates.request_step(with_grad, snapshot)

    def before_forward(self, indices: Sequence[int], what: str) -> bool:
        if not any(self.updates.pending(i) for i in indices):
            return False
        self.updates.wait_and_apply(indices, what)
        return True

    def synchronize(self) -> None:
        """Nothing beyond the updates the plane applies: the parameters are the reduced results'."""

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        return self.handover.clip_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_value(self, value: float) -> None:
        self.handover.clip_value(value)

    def gather_model(self) -> None:
        """Nothing but the gradients' messages on the link."""

    def full_state_dict(self, rank0_only: bool) -> dict:  # the coordinator synchronized first; whole everywhere
        return self.updates.optimizer.state_dict()

    def state_saved(self, state_dict: dict) -> None:
        """Nothing: every rank holds the whole state."""

    def state_loading(self, state_dict: dict) -> None:
        """Nothing: any rank's state loads anywhere, as under DDP."""
