"""The coordinator: what the objects a user holds call on the training thread of one rank.

It holds the run's record (:class:`~gradsched.runtime.training.run.Run`: what lives as long as
the wrap, made by the frontend) and the *architecture* (:mod:`gradsched.runtime.architectures`),
chosen once by the frontend, which opens the one *backend* that reduces, behind one interface,
so that no caller asks which is active:

* gradsched's own plane (:class:`~gradsched.runtime.training.plane.Plane`): the round on
  gradsched's data plane, its hooks, plans and control points, for all-reduce, parameter
  servers and sharded;
* DDP's reducer (:mod:`gradsched.runtime.architectures.reducer`), after the step that
  follows the measured trial's keeping DDP-style buckets (at the next
  ``zero_grad(set_to_none=True)`` or forward pass): the hand-off swaps the architecture, and
  with it the backend; the plane retires whole (its threads stop, nothing refers to it), and
  what it measured stays readable in the record.

A *round* is one backward pass that communicates, counted once for the run
(:class:`~gradsched.runtime.training.lifecycle.RoundLife`, the record's) whichever backend
reduces it. Plans change only at control points, fixed rounds at which every rank takes part
in one broadcast from rank 0.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.distributed.algorithms.join import Joinable

from gradsched.runtime.comm.broadcast import broadcast_model
from gradsched.runtime.diagnostics.stats import RunStats
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.training.architecture import Architecture, Backend
from gradsched.runtime.training.hooks import Hook
from gradsched.runtime.training.lifecycle import Phase
from gradsched.runtime.training.run import Run
from gradsched.runtime.training.updates import clear_grad


class Coordinator:
    def __init__(self, run: Run, architecture: Architecture) -> None:
        self.run = run
        self.architecture = architecture  # checked the optimizer (gradsched.runtime.frontend.wrap.start)
        self.on_close: list[Callable[[], None]] = []
        self.replaced = False  # closed because a later wrap of the same model took over
        self._closed = False
        self.backend: Backend = architecture.open(run)  # the one reducing now
        self._handles: list[Any] = []
        self._optimizer_handles: list[Any] = []
        try:  # nothing of a half-built coordinator may outlive it: hooks, threads
            run.watch()
            self.backend.attach()
            model = run.model
            self._handles = [model.register_forward_pre_hook(Hook(self._forward_begins), with_kwargs=True,
                                                             prepend=True),
                             model.register_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize())),
                             model.register_load_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize()))]
            self._watch_checkpoints(run.updates.optimizer)
        except BaseException:
            self._abandon()
            raise

    # -- what others read -----------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def round(self) -> int:
        """The latest round begun (backward pass that communicates), from 1, before the hand-off
        and after it."""
        return self.run.life.index

    @property
    def uneven(self) -> Joinable:
        """The Joinable of ``join()``: the plane's, or DDP's after the hand-off."""
        return self.backend.uneven

    # -- the optimizer's and the model's entry points ------------------------------------------
    def check_in_use(self, what: str) -> None:
        """Raise if a later wrap of the same model took over from this one."""
        if self.replaced:
            raise GradschedError(f"{what}: the model was wrapped again since; a later gradsched.wrap or "
                                 "gradsched.DistributedDataParallel of the same model took over: use what it returned")

    def step(self) -> None:
        self.check_in_use("optimizer.step()")
        self.backend.step()

    def _forward_begins(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The root module's first forward pre-hook: a hand-off still due happens now."""
        successor = self._hand_off_due()
        if successor is None:
            return None
        self._hand_off_buckets(successor)
        return self.backend.opened_in_forward(module, args, kwargs)

    def step_unscheduled(self) -> None:
        """Step the optimizer's parameters outside the plans (:meth:`DeferredUpdates.step_others`)."""
        self.run.updates.step_others(self.run.index)

    def _hand_off_due(self) -> Architecture | None:
        """The architecture the kept buckets go to, once the measured trial kept them at a control
        point (every rank at the same one: the record's ``handoff_due``); None: nothing due."""
        if not self.run.handoff_due:
            return None
        successor = self.architecture.handed_off(self.run.config, self.run.world_size)
        if successor is None:  # the buckets stay on gradsched's plane
            self.run.handoff_due = False
        return successor

    def _hand_off_buckets(self, successor: Architecture) -> None:
        """The architecture the buckets go to (DDP's C++ reducer: :mod:`gradsched.runtime.architectures.reducer`)
        reduces from the next backward pass on; gradsched's plane retires whole. Due from the step
        after the decision on, it happens where the gradients are let go, so that they never exist
        twice (the reducer's buckets and gradsched's): at ``zero_grad(set_to_none=True)`` after
        that step, or else as the next forward pass begins (the gradients then move into the
        reducer's buckets: held twice for that moment)."""
        self.synchronize()
        self.backend.retire()
        self.architecture = successor
        self.backend = successor.open(self.run)
        self.run.handoff_due = False
        self.run.handed_off_round = self.round + 1

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply ``optimizer`` from now on (the model was wrapped before it existed)."""
        self.architecture.check_optimizer(optimizer)
        self.run.updates.optimizer = optimizer
        self._watch_checkpoints(optimizer)

    def _watch_checkpoints(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The backend marks the optimizer's ``state_dict()`` and checks what ``load_state_dict()``
        is given (a sharded rank refuses another rank's part)."""
        for handle in self._optimizer_handles:
            handle.remove()
        self._optimizer_handles = [] if optimizer is None else [
            optimizer.register_state_dict_post_hook(lambda opt, state: self.backend.state_saved(state)),
            optimizer.register_load_state_dict_pre_hook(lambda opt, state: self.backend.state_loading(state))]

    def zero_grad(self, set_to_none: bool) -> None:
        self.check_in_use("zero_grad()")
        run = self.run
        run.updates.request_zero(set_to_none)
        # parameters the optimizer knows but gradsched does not communicate (frozen ones)
        optimizer = run.updates.optimizer
        for group in optimizer.param_groups if optimizer is not None else []:
            for p in group["params"]:
                if id(p) not in run.index:
                    clear_grad(p, set_to_none)
        if set_to_none and run.life.phase is Phase.STEPPED:
            successor = self._hand_off_due()
            if successor is not None:
                self._hand_off_buckets(successor)

    def clip_grad_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                       foreach: bool | None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the reduced gradients: waits for every reduction
        (before any backward pass, as torch's over no gradients: the norm 0)."""
        return self.backend.clip_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_grad_value(self, clip_value: float) -> None:
        """Clamp every gradient, each once its reduction is complete (nothing waits now)."""
        self.backend.clip_value(clip_value)

    def full_optimizer_state_dict(self, rank0_only: bool = True) -> dict:
        """The optimizer's state as the same optimizer holds it without sharding (a collective
        under the sharded architectures, joined on rank 0 only with ``rank0_only``; the
        optimizer's own ``state_dict()`` otherwise)."""
        self.synchronize()
        return self.backend.full_state_dict(rank0_only)

    def synchronize(self) -> None:
        if not self._closed:
            self.backend.synchronize()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.check_in_use("no_sync()")
        sync = self.run.sync
        sync.depth += 1
        self.backend.set_sync(sync.enabled)
        try:
            yield
        finally:
            sync.depth -= 1
            self.backend.set_sync(sync.enabled)

    def set_backward_sync(self, enabled: bool) -> None:
        """DDP's ``require_backward_grad_sync = enabled``: read by each later forward pass."""
        self.run.sync.backward = bool(enabled)
        self.backend.set_sync(self.run.sync.enabled)

    def forward_param_sync(self, enabled: bool | None = None) -> bool:
        """DDP's ``require_forward_param_sync`` (set it with ``enabled``)."""
        return self.backend.forward_param_sync(enabled)

    # -- reporting and teardown ------------------------------------------------------------
    def export_profile(self, path: str, name: str) -> str:
        run = self.run
        return run.measured.export_profile(path, name, run.clock, run.config.profile_rounds)

    def stats(self) -> RunStats:
        """What the run reports, from its record (also after the hand-off, the plane gone)."""
        run = self.run
        measured = run.measured
        plan = measured.plan_for(self.round + 1)
        est = measured.estimator
        exposure = run.exposure.summary() or (None, None, None)
        return RunStats(run.policy.name, self.round, len(plan.messages), measured.plans_adopted,
                        est.latency, est.bytes_per_second, plan.policy, measured.settled_round, measured.prediction,
                        measured.trial, measured.tuning, list(measured.switches), run.handed_off_round, *exposure,
                        plan_options=dict(plan.options), ranks=measured.ranks)

    def broadcast_buffers(self, source: int = 0) -> None:
        """Copy rank ``source``'s buffers (BatchNorm statistics) to every worker: under way on
        return, waited for by the forward passes that read them (gradsched.runtime.training.buffer_sync)."""
        self.backend.broadcast_buffers(source)

    def broadcast_model(self, source: int) -> None:
        """Copy rank ``source``'s parameters (and buffers, unless buffers are not synced) to every worker."""
        self.synchronize()
        run = self.run
        broadcast_model(run.model, run.config.broadcast_buffers, source, run.topology.buffers, run.explain)

    def idle(self) -> bool:
        """Nothing failed and no gradient handed over is still being communicated."""
        return self.backend.idle()

    def _abandon(self) -> None:
        """Undo a construction that failed half-way: the hooks attached, the threads started."""
        self._closed = self.run.life.closed = True
        for handle in self._handles:
            handle.remove()
        self._watch_checkpoints(None)
        if self.run.peers is not None:
            self.run.peers.stop()
        self.backend.close(wait=False)
        self.backend.stop(wait=False)

    def close(self, wait: bool = True) -> None:
        """Detach and stop; with ``wait``, first finish the communication in flight."""
        if self._closed:
            return
        run = self.run
        try:
            self.backend.close(wait)
        finally:
            self._closed = run.life.closed = True
            run.life.active_at = time.monotonic()
            run.peers.close()
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self._watch_checkpoints(None)
            for release in self.on_close:  # what the objects users hold let go of (DistributedDataParallel's)
                release()
            self.backend.stop(wait)  # every object lets go of the groups it used (DDP, and through it the model)
            run.device.close()
            run.topology.release()
            if run.trace:
                run.trace.save(run.config.trace)
