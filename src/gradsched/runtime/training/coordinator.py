"""The coordinator: what the objects a user holds call on the training thread of one rank.

It owns the rank's pieces that outlive any one way of reducing (the options, the process
groups, no_sync()'s switches, the rounds, the ranks' progress, what scheduling bought) and
the *architecture* (:mod:`gradsched.runtime.architectures`), chosen once by the frontend. The
architecture opens the one *backend* that reduces, behind one interface, so that no caller
asks which is active:

* gradsched's own plane (:class:`~gradsched.runtime.training.plane.Plane`): the round on
  gradsched's data plane, its hooks, plans and control points, for all-reduce, parameter
  servers and sharded;
* DDP's reducer (:mod:`gradsched.runtime.architectures.reducer`), after the step that
  follows the measured trial's keeping DDP-style buckets (at the next
  ``zero_grad(set_to_none=True)`` or forward pass): the hand-off swaps the architecture, and with it the
  backend (the plane's threads stop; what it measured stays readable).

A *round* is one backward pass that communicates, counted once for the run
(:class:`~gradsched.runtime.training.lifecycle.RoundLife`) whichever backend reduces it. Plans
change only at control points, fixed rounds at which every rank takes part in one broadcast
from rank 0.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from gradsched.core.base import PolicyConfig
from gradsched.runtime.comm.broadcast import broadcast_model
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.diagnostics.exposure import Exposure
from gradsched.runtime.diagnostics.peer_status import PeerStatus, Status
from gradsched.runtime.diagnostics.stats import RunStats
from gradsched.runtime.diagnostics.tracing import RunTrace
from gradsched.runtime.errors import GradschedError, entry
from gradsched.runtime.planning.clock import Clock
from gradsched.runtime.architectures.base import Architecture, Backend
from gradsched.runtime.training.hooks import Hook
from gradsched.runtime.training.join import Iteration
from gradsched.runtime.training.lifecycle import Phase, RoundLife
from gradsched.runtime.training.syncing import SyncSwitches
from gradsched.runtime.training.updates import clear_grad


class Coordinator:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        names: Sequence[str],
        params: Sequence[nn.Parameter],
        policy: PolicyConfig,
        config: RuntimeConfig,
        topology: Topology,
        architecture: Architecture,
        sparse: tuple[Sequence[str], Sequence[nn.Parameter]] = ((), ()),
        comm_hook: tuple[Any, Callable] | None = None,
    ) -> None:
        self.architecture = architecture  # checked the optimizer (gradsched.runtime.frontend.wrap.start)
        self.model, self.optimizer, self.policy, self.config, self.topology = model, optimizer, policy, config, topology
        self.names, self.params = list(names), list(params)
        self.rank, self.world_size = topology.rank, topology.num_workers
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.comm_hook = comm_hook  # (state, hook): DDP's communication hook on every message
        self.sparse = sparse  # (names, parameters) with sparse gradients: reduced outside the plans
        self.trace = RunTrace(self.rank) if config.trace else None
        self.clock = Clock(next((p.device for p in self.params if p.is_cuda), None))
        self.sync = SyncSwitches()  # no_sync() and DDP's require_*_sync (gradsched.runtime.training.syncing)
        self.life = RoundLife()  # the rounds, whichever backend reduces them: one counter for the run
        self.life.active_at = time.monotonic()
        self.exposure = Exposure()  # what scheduling bought (gradsched.runtime.diagnostics.exposure)
        self.entry = entry()  # what the user called, for errors raised later
        self.on_close: list[Callable[[], None]] = []
        self.replaced = False  # closed because a later wrap of the same model took over
        self._closed = False
        self.handed_off_round: int | None = None
        self._successor: Architecture | None = None  # the trial kept the buckets: what takes them over
        self.backend: Backend = architecture.open(self)  # the one reducing now
        self._handles: list[Any] = []
        try:  # nothing of a half-built coordinator may outlive it: hooks, threads
            self.peers = PeerStatus(self.rank, topology.workers, self._status, topology.control)
            self.backend.attach()
            self._handles = [self.model.register_forward_pre_hook(Hook(self._forward_begins), with_kwargs=True,
                                                                  prepend=True),
                             self.model.register_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize())),
                             self.model.register_load_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize()))]
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
        return self.life.index

    @property
    def uneven(self) -> Any:
        """The Joinable of ``join()``: the plane's, or DDP's after the hand-off."""
        return self.backend.uneven

    @property
    def updates(self) -> Any:
        return self.backend.updates

    @property
    def planner(self) -> Any:
        return self.backend.planner

    @property
    def tensors(self) -> Any:
        return self.backend.tensors

    @property
    def waits(self) -> Any:
        return self.backend.waits

    # -- what join needs (gradsched.runtime.training.join.Joining) -----------------------------
    @property
    def control_group(self):
        return self.topology.control

    def control_point(self, round_index: int) -> None:
        self.backend.planner.control_point(round_index)

    def explain(self) -> str:
        return self.peers.explain()

    @property
    def policy_name(self) -> str:
        return self.policy.name

    def shadow(self, iteration: Iteration) -> None:
        """On a rank that has joined: one iteration of the ranks still training, with zeros."""
        self.backend.shadow(iteration)

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
        if self._successor is None:
            return None
        self._hand_off_buckets()
        return self.backend.opened_in_forward(module, args, kwargs)

    def step_unscheduled(self) -> None:
        """Step the optimizer's parameters outside the plans (:meth:`DeferredUpdates.step_others`)."""
        self.backend.updates.step_others(self.index)

    def buckets_kept(self) -> None:  # every rank, one control point; inside join() no rank steps at one point
        if not self.backend.uneven.enabled:
            self._successor = self.architecture.handed_off(self.config, self.world_size)

    def _hand_off_buckets(self) -> None:
        """The architecture the buckets go to (DDP's C++ reducer: :mod:`gradsched.runtime.architectures.reducer`)
        reduces from the next backward pass on; gradsched's plane stops. Due from the step after
        the decision on, it happens where the gradients are let go, so that they never exist
        twice (the reducer's buckets and gradsched's): at ``zero_grad(set_to_none=True)`` after
        that step, or else as the next forward pass begins (the gradients then move into the
        reducer's buckets: held twice for that moment)."""
        self.synchronize()
        self.architecture, self._successor = self._successor, None
        self.backend = self.architecture.open(self)
        self.handed_off_round = self.round + 1

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply ``optimizer`` from now on (the model was wrapped before it existed)."""
        self.architecture.check_optimizer(optimizer)
        self.optimizer = self.backend.updates.optimizer = optimizer

    def zero_grad(self, set_to_none: bool) -> None:
        self.check_in_use("zero_grad()")
        self.backend.updates.request_zero(set_to_none)
        # parameters the optimizer knows but gradsched does not communicate (frozen ones)
        for group in self.optimizer.param_groups if self.optimizer is not None else []:
            for p in group["params"]:
                if id(p) not in self.index:
                    clear_grad(p, set_to_none)
        if set_to_none and self.life.phase is Phase.STEPPED and self._successor is not None:
            self._hand_off_buckets()

    def clip_grad_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                       foreach: bool | None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the reduced gradients: waits for every reduction
        (before any backward pass, as torch's over no gradients: the norm 0)."""
        return self.backend.clip_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_grad_value(self, clip_value: float) -> None:
        """Clamp every gradient, each once its reduction is complete (nothing waits now)."""
        self.backend.clip_value(clip_value)

    def full_optimizer_state_dict(self) -> dict:
        """The optimizer's state as the same optimizer holds it without sharding (a collective
        under architecture='sharded'; the optimizer's own ``state_dict()`` otherwise)."""
        self.synchronize()
        return self.backend.full_state_dict()

    def synchronize(self) -> None:
        if not self._closed:
            self.backend.synchronize()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.check_in_use("no_sync()")
        self.sync.depth += 1
        self.backend.set_sync(self.sync.enabled)
        try:
            yield
        finally:
            self.sync.depth -= 1
            self.backend.set_sync(self.sync.enabled)

    def set_backward_sync(self, enabled: bool) -> None:
        """DDP's ``require_backward_grad_sync = enabled``: read by each later forward pass."""
        self.sync.backward = bool(enabled)
        self.backend.set_sync(self.sync.enabled)

    def forward_param_sync(self, enabled: bool | None = None) -> bool:
        """DDP's ``require_forward_param_sync`` (set it with ``enabled``)."""
        return self.backend.forward_param_sync(enabled)

    # -- reporting and teardown ------------------------------------------------------------
    def export_profile(self, path: str, name: str) -> str:
        return self.backend.planner.export_profile(path, name)

    def stats(self) -> RunStats:
        exchange, planner = self.backend.exchange, self.backend.planner
        plan = exchange.plan_for(self.round + 1)
        est = exchange.estimator
        exposure = self.exposure.summary() or (None, None, None)
        return RunStats(self.policy.name, self.round, len(plan.messages), exchange.plans_adopted,
                        est.latency, est.bytes_per_second, plan.policy, planner.settled_round, planner.prediction,
                        planner.trial, planner.tuning, list(planner.switches), self.handed_off_round, *exposure,
                        plan_options=dict(plan.options))

    def broadcast_buffers(self, source: int = 0) -> None:
        """Copy rank ``source``'s buffers (BatchNorm statistics) to every worker: under way on
        return, waited for by the forward passes that read them (gradsched.runtime.training.buffer_sync)."""
        self.backend.broadcast_buffers(source)

    def broadcast_model(self, source: int) -> None:
        """Copy rank ``source``'s parameters (and buffers, unless buffers are not synced) to every worker."""
        self.synchronize()
        broadcast_model(self.model, self.config.broadcast_buffers, source, self.topology.buffers, self.explain)

    def _status(self) -> Status:
        """This rank's progress, for a rank whose communication failed (gradsched.runtime.diagnostics.peer_status)."""
        state = "closed" if self._closed else "joined" if self.backend.joined else "training"
        began = self.life.in_forward and state == "training"  # a forward pass
        return Status(self.round + int(began), state, time.monotonic() - self.life.active_at)

    def idle(self) -> bool:
        """Nothing failed and no gradient handed over is still being communicated."""
        return self.backend.idle()

    def _abandon(self) -> None:
        """Undo a construction that failed half-way: the hooks attached, the threads started."""
        self._closed = True
        for handle in self._handles:
            handle.remove()
        if hasattr(self, "peers"):
            self.peers.stop()
        self.backend.close(wait=False)
        self.backend.stop(wait=False)

    def close(self, wait: bool = True) -> None:
        """Detach and stop; with ``wait``, first finish the communication in flight."""
        if self._closed:
            return
        try:
            self.backend.close(wait)
        finally:
            self._closed = True
            self.life.active_at = time.monotonic()
            self.peers.close(self._status())
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            for release in self.on_close:  # what the objects users hold let go of (DistributedDataParallel's)
                release()
            self.backend.stop(wait)  # every object lets go of the groups it used (DDP, and through it the model)
            self.topology.release()
            if self.trace:
                self.trace.save(self.config.trace)
