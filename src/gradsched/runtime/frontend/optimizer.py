"""The optimizer ``gradsched.wrap`` returns: the user's own optimizer, applied per parameter.

:class:`ScheduledOptimizer` is a :class:`torch.optim.Optimizer` whose ``param_groups``,
``state`` and ``defaults`` ARE those of the wrapped optimizer, so learning-rate schedulers,
``add_param_group``-free code and checkpoints see exactly what they would see unwrapped,
and ``state_dict()`` is the wrapped optimizer's own format.

``step()`` does not wait for communication. It records the hyper-parameters of every group
at that moment; each parameter is then updated, with those hyper-parameters, once its
gradient is reduced: at the latest just before the next forward pass of the module that
uses it. ``zero_grad()`` likewise waits for a gradient still being communicated. The
update itself is the wrapped optimizer's ``step()`` run on a subset of parameters.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import torch

from gradsched.runtime.errors import GradschedError
from gradsched.runtime.training.join import JoinsUnevenInputs, UnevenInputs

if TYPE_CHECKING:  # pragma: no cover
    from gradsched.runtime.training.coordinator import Coordinator
    from gradsched.runtime.diagnostics.stats import RunStats


class ScheduledOptimizer(torch.optim.Optimizer, JoinsUnevenInputs):
    def __init__(self, inner: torch.optim.Optimizer, coordinator: Coordinator) -> None:
        self._inner = inner
        self._coordinator = coordinator
        self._stepped_round = 0  # the backward pass (round) the latest step() followed
        self._ready = False
        # The base initialiser sets up the hook registries; the groups it would build are
        # ignored (the properties below route to the wrapped optimizer).
        super().__init__(inner.param_groups, inner.defaults)
        self._ready = True

    # -- shared state with the wrapped optimizer ------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self._inner.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        if self._ready:
            self._inner.param_groups = value

    @property
    def state(self):  # type: ignore[override]
        return self._inner.state

    @state.setter
    def state(self, value) -> None:
        if self._ready:
            self._inner.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self._inner.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        if self._ready:
            self._inner.defaults = value

    @property
    def wrapped(self) -> torch.optim.Optimizer:
        """The user's optimizer (do not call its ``step`` directly while wrapped)."""
        return self._inner

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._ready:
            raise RuntimeError(
                "gradsched: parameters cannot be added to a wrapped optimizer; add them before "
                "gradsched.wrap, or wrap again"
            )

    # -- the training loop ------------------------------------------------------------------
    def step(self, closure=None):  # type: ignore[override]
        """Schedule this step's updates (each parameter is updated once its gradient is
        reduced). With a ``closure``, as torch.optim's optimizers do (and trainers call
        them): run it first, with gradients enabled (it computes the loss and calls
        ``backward()``), and return what it returns. A closure that runs no backward pass
        is fine after one that did (Lightning's manual optimisation steps so), not instead."""
        return self.schedule_step(closure, unscheduled=True)

    @torch.no_grad()
    def schedule_step(self, closure=None, unscheduled: bool = True):
        """:meth:`step`; ``unscheduled``: also step the parameters outside the plans (sparse, ignored)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if self._coordinator.round == self._stepped_round:
                raise GradschedError(
                    "gradsched: step(closure): no backward pass that communicates ran since the last step; the "
                    "closure must compute the loss and call backward() on it (outside no_sync()), as torch.optim "
                    "expects"
                )
        self._coordinator.step()
        if unscheduled:  # (gradsched.DistributedDataParallel's binding runs the optimizer's own step on those)
            self._coordinator.step_unscheduled()
        self._stepped_round = self._coordinator.round
        if self._optimizer_step_post_hooks:
            # code hooked after step() (EMA, SWA, logging) reads parameters: update them all now
            self._coordinator.synchronize()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._coordinator.zero_grad(set_to_none)

    def synchronize(self) -> None:
        """Wait for all communication and apply every pending update. Call it before anything
        that reads all gradients or parameters at once: global-norm clipping, an AMP
        ``GradScaler`` step, logging gradient norms, evaluating outside ``model(...)``."""
        self._coordinator.synchronize()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the model's reduced gradients, returning the
        total norm. Call it after ``backward()`` (after ``GradScaler.unscale_`` with AMP) and
        before ``step()``. It waits for every reduction, so the next forward pass cannot
        overlap communication any more (docs/guide.md, "Clipping")."""
        return self._coordinator.clip_grad_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_grad_value_(self, clip_value: float) -> None:
        """``torch.nn.utils.clip_grad_value_`` over the model's gradients, without waiting:
        each gradient is clamped to ``[-clip_value, clip_value]`` once it is reduced."""
        self._coordinator.clip_grad_value(clip_value)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally without communicating (the
        next backward pass outside communicates the sum), like DDP's ``no_sync``."""
        with self._coordinator.no_sync():
            yield

    def export_profile(self, path: str, name: str = "measured") -> str:
        """Write this rank's measured per-layer table (forward and backward time of each
        module, its parameters; the medians of the latest measured backward passes) in the
        profile format of docs/profile-format.md, and return ``path``. Then
        ``gradsched simulate --profile PATH --workers 64 --bandwidth 10Gbit`` predicts what
        each policy would do for this model on a cluster of any size. The times are this
        machine's, scaled by nothing."""
        return self._coordinator.export_profile(path, name)

    def close(self) -> None:
        """Finish communication, detach every hook and stop the background thread."""
        self._coordinator.close()

    def _uneven_inputs(self) -> UnevenInputs:  # join(): see gradsched.runtime.training.join
        return self._coordinator.uneven

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        self._coordinator.synchronize()
        return self._inner.state_dict()

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, Any]:
        """``state_dict()`` as the wrapped optimizer holds it without sharding, loadable into a
        plain optimizer of the same kind and into this one on any rank (save on rank 0, load
        everywhere). Under the sharded architectures every rank's shards are joined (a
        collective: call it on every rank), on rank 0 only by default (the others get the
        parameter groups and an empty ``state``, and no rank's live state grows); with
        ``rank0_only=False`` on every rank. Else ``state_dict()``."""
        return self._coordinator.full_optimizer_state_dict(rank0_only)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self._coordinator.synchronize()
        self._inner.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"ScheduledOptimizer({self._coordinator.run.policy.name}, {self._inner!r})"

    @property
    def stats(self) -> RunStats:
        """Rounds, the plan in use, the measured link, and what the measured trial and the
        online tuner found (:class:`gradsched.runtime.RunStats`)."""
        return self._coordinator.stats()
