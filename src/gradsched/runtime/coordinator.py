"""The coordinator: what happens on the training thread of one rank.

* a post-accumulate-grad hook per parameter hands each gradient to the exchange;
* a forward pre-hook per module that owns parameters waits for those parameters' reduction
  and applies every pending update (the Dependency Proxy: a layer waits only for itself);
* the root module's forward pre-hook closes the previous round, broadcasts buffers and
  waits for parameters used outside the module that owns them;
* ``step`` / ``zero_grad`` / ``synchronize`` of the returned optimizer come here.

A *round* is one backward pass that communicates. Plans change only at control points,
fixed rounds at which every rank takes part in one broadcast from rank 0.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..core.base import PolicyConfig
from .broadcast import broadcast_model
from .buffer_sync import BufferSync
from .config import RuntimeConfig
from .errors import GradschedError, entry
from .exposure import Exposure, say_exposure
from .comm.exchange import Exchange
from .hooks import Hook
from .inflight import Handover, plain
from .join import Iteration, UnevenInputs
from .peer_status import PeerStatus, Status
from .planning import Planner, initial_plan
from .comm.plans import PlanVersions, tensor_specs
from .clock import Clock
from .profiling import RoundTiming
from .rounds import Round
from .stats import RunStats
from .syncing import SyncSwitches
from .topology import Topology
from .tracing import RunTrace
from .unused import UnusedParameters, agree_unused
from .comm.streams import produced_here
from .comm.transports import make_transport, travelling_dtype
from .handoff import TorchReducer, hands_off
from .sparse import SparseGradients

from .updates import DeferredUpdates, clear_grad
from .waits import ModuleWaits


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
        sparse: tuple[Sequence[str], Sequence[nn.Parameter]] = ((), ()),
        comm_hook: tuple[Any, Callable] | None = None,
    ) -> None:
        self.model, self.optimizer, self.policy, self.config, self.topology = model, optimizer, policy, config, topology
        self.names, self.params = list(names), list(params)
        self.rank, self.world_size = topology.rank, topology.num_workers
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.comm_hook = comm_hook  # (state, hook): DDP's communication hook on every message
        self.trace = RunTrace(self.rank) if config.trace else None
        self.clock = Clock(next((p.device for p in self.params if p.is_cuda), None))
        self.exchange = self._data_plane()
        self._handles: list[Any] = []
        self._closed = False
        self.current = Round()
        self.sync = SyncSwitches()  # no_sync() and DDP's require_*_sync (gradsched.runtime.syncing)
        self.sparse = SparseGradients(*sparse, topology, self)  # outside the plans (gradsched.runtime.sparse)
        self.handover = Handover(self.params, self.exchange)
        self.updates = DeferredUpdates(optimizer, self.params, self.names, self.exchange, self.handover, self.trace)
        self._globally_unused: set[int] = set()
        self._tracing_module: tuple[str, float] | None = None
        self._broken = False
        self.uneven = UnevenInputs(self)  # join(): ranks with fewer batches shadow the others
        self._active_at = time.monotonic()  # the latest forward pass began (or the wrap)
        self.on_close: list[Callable[[], None]] = []
        self.replaced = False  # closed because a later wrap of the same model took over
        self.entry = entry()  # what the user called, for errors raised later
        self.unused = UnusedParameters(self.params) if config.find_unused_parameters else None
        self.exposure = Exposure()  # what scheduling bought (gradsched.runtime.exposure)
        self.reducer: TorchReducer | None = None  # DDP's, from handed_off_round on (gradsched.runtime.handoff)
        self.handed_off_round: int | None = None
        self._hand_off = False  # the trial kept the buckets: hand them over at the next step()
        try:  # nothing of a half-built coordinator may outlive it: hooks, threads
            self.peers = PeerStatus(self.rank, topology.workers, self._status, topology.control)
            self.exchange.explain = self.peers.explain
            self._attach()
        except BaseException:
            self._abandon()
            raise

    def _data_plane(self) -> Exchange:
        """The plans (counting what travels: compressed, or the hook's dtype where known), the
        transport (the communication hook's, if any) and the launcher thread."""
        config, hook = self.config, self.comm_hook
        self.tensors = tensor_specs(self.names, self.params, travelling_dtype(config.compression, hook))
        versions = PlanVersions(initial_plan(self.tensors, self.policy, config.architecture))
        transport = make_transport(self.topology, self.names, self.params, versions, config.compression, hook)
        return Exchange(self.tensors, self.params, versions, transport, config.timeout,
                        self.trace.on_exchange if self.trace else None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def round(self) -> int:
        """The latest round begun (backward pass that communicates), numbered from 1."""
        return self.current.index

    # -- what join needs (gradsched.runtime.join.Joining) -----------------------------------
    @property
    def control_group(self):
        return self.topology.control

    def control_point(self, round_index: int) -> None:
        self.planner.control_point(round_index)

    def explain(self) -> str:
        return self.peers.explain()

    @property
    def policy_name(self) -> str:
        return self.policy.name

    # -- hooks ----------------------------------------------------------------------------
    def _attach(self) -> None:
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._handles.extend(self.sparse.attach())
        self.waits = ModuleWaits(self.model, self.index)  # the Dependency Proxy's map (gradsched.runtime.waits)
        allreduce = self.config.architecture == "allreduce"  # else the data group holds the servers too
        self.buffer_sync = BufferSync(self.model, self.exchange,
                                      lambda: self.topology.data if allreduce else self.topology.buffers,
                                      allreduce, self.explain)
        self.planner = Planner(self.tensors, self.params, self.policy, self.config, self.waits.owners(self.names),
                               self.exchange,
                               self.topology.control, self.rank, self.world_size,
                               self.topology.data, self.clock,
                               settle=partial(self.exchange.wait_reduced, range(len(self.params)), "all parameters"),
                               on_buckets_kept=self._buckets_kept)
        self._handles.append(self.model.register_forward_pre_hook(Hook(self._before_root)))
        self._handles.append(self.model.register_forward_hook(Hook(self._after_root)))
        for module in self.model.modules():
            if module in self.waits.hooked or module in self.buffer_sync.owners:
                self._handles.append(module.register_forward_pre_hook(Hook(self._before_module)))
        self._handles.append(self.model.register_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize())))
        self._handles.append(self.model.register_load_state_dict_pre_hook(Hook(lambda *a, **k: self.synchronize())))

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._closed:
            return
        i = self.index[id(p)]
        grad = plain(p.grad)  # None: an undefined gradient reached this parameter
        if self.sync.local:
            if self.unused is not None and grad is not None:
                self.unused.local_gradient(i)
            return
        if self.current.next_begins:
            self._start_round()
            if self.unused is not None:
                self.unused.begin()  # which parameters will this backward pass reach?
        if grad is not None:
            self._hand_over_grad(i, grad)
        if self.unused is not None and self.unused.report(i, grad is not None):
            self._settle_unused()  # the last gradient this backward pass gives the model

    def _hand_over_grad(self, i: int, grad: torch.Tensor) -> None:
        if self.exchange.ready_round[i] == self.round:
            raise GradschedError(
                f"parameter {self.names[i]!r} received a gradient twice in one backward pass; run one "
                "backward per forward, and use no_sync() for backward passes that should not communicate"
            )
        grad = self.handover.place(grad, self.current.homes.get(i))
        timing, key = self.current.timing, ("ready", self.names[i])
        now = timing.ready[self.names[i]] = self.clock.stamp(timing, key)  # its event: also where it was produced
        if self.trace:
            self.trace.ready(self.round, self.names[i], now, backward_from=timing.forward_end)
        self.handover.hand_over(i, grad, self.round, self.current.grad_scale,
                                produced=produced_here(self.clock.device, timing.events.get(key)))

    def _start_round(self) -> None:
        self.current.begin(self.exchange.homes(self.round + 1))

    def _before_root(self, module: nn.Module, args: Any) -> None:
        if self._closed:
            return
        self._close_round()
        if not self.exchange.plan_for(self.round + 1).cross_barrier:
            self.synchronize()
        else:  # a gradient no step claimed would have the next backward pass added to it on the wire
            unclaimed = [i for i in range(len(self.params)) if self.exchange.in_flight(i)
                         and not self.updates.pending(i)]
            if unclaimed:
                self.updates.wait_and_apply(unclaimed, "gradients accumulated without a step")
        self._active_at = time.monotonic()
        self.current.forward_ran = True
        self.current.next_begins = True
        source = 0
        if self.sync.training(torch.is_grad_enabled()):  # a training iteration begins
            self.exposure.iteration_began(time.perf_counter(), self.exchange.waited_s)
            if self.exposure.count % 50 == 0 and self.rank == 0:
                say_exposure(self.exposure, self.exchange.plan_for(self.round + 1).policy, self.planner.trial)
        self.current.grad_scale = None
        training, sync_buffers = self.sync.forward_began(torch.is_grad_enabled())
        if training and not self.uneven.enabled:  # a round no step() followed (no optimizer; two backward
            self.planner.control_point(self.round)  # passes per step); inside join(): in announce()
        if self.uneven.enabled:  # the joined ranks shadow what the iteration says: buffers synced as it trains
            iteration = self.uneven.announce(self.round, training)
            source, self.current.grad_scale = iteration.source, self.uneven.grad_scale(iteration)
            sync_buffers = training
        if self.config.broadcast_buffers and self.world_size > 1 and sync_buffers:
            self.broadcast_buffers(source)
        self.current.ran.clear()
        self.current.timing = timing = RoundTiming()
        timing.forward_start = self.clock.stamp(timing, "forward_start")

    def shadow(self, iteration: Iteration) -> None:
        """On a rank that has joined: take part in one iteration of the ranks still training
        with zero gradients and no update (see :mod:`gradsched.runtime.join`)."""
        if self.config.broadcast_buffers and self.world_size > 1 and iteration.communicates:
            self.broadcast_buffers(iteration.source)
        if not iteration.communicates:
            return
        self._start_round()
        everything = range(len(self.params))
        for i in everything:
            home = self.current.homes.get(i)
            self.exchange.mark_ready(i, home.zero_() if home is not None else torch.zeros_like(self.params[i]),
                                     self.round)
        self.current.open = False
        self.current.next_begins = True
        self.sparse.shadow()  # the training ranks reduce theirs in backward()
        if self.unused is not None:
            # counted as using every parameter, as DDP's joined ranks are: while a rank has
            # joined, a parameter the others all left unused gets a zero gradient, not none
            self._agree_unused([])
        self.exchange.wait_reduced(everything, "zero gradients shadowing the ranks still training (join)")

    def _after_root(self, module: nn.Module, args: Any, output: Any) -> None:
        self.sync.forward_ended(torch.is_grad_enabled())
        self.current.timing.forward_end = self.clock.stamp(self.current.timing, "forward_end")
        if self.trace:
            self._trace_forward(self.current.timing.forward_end)

    def _trace_forward(self, now: float) -> None:
        """Close the forward span of the module that ran last."""
        if self._tracing_module is not None:
            name, start = self._tracing_module
            self.trace.span("forward", name, start, now)
            self._tracing_module = None

    def _before_module(self, module: nn.Module, args: Any) -> None:
        if self._closed:
            return
        self.current.ran.add(id(module))
        self.buffer_sync.before(module)
        idx = self.waits.of.get(module)
        if not idx:
            return
        name = self.waits.name[module]
        first = name not in self.current.timing.module_starts
        entered = time.perf_counter()
        if first:
            self.current.timing.module_starts[name] = self.clock.stamp(self.current.timing, ("module", name))
        if any(self.updates.pending(i) for i in idx):
            self.updates.wait_and_apply(idx, f"module {name}")
            if first:
                self.current.timing.module_waits[name] = time.perf_counter() - entered
        if self.trace:
            now = time.perf_counter()
            self._trace_forward(entered)
            self._tracing_module = (name or type(module).__name__, now)

    # -- rounds ---------------------------------------------------------------------------
    def _close_round(self) -> None:
        """The backward pass of the open round is over: every trainable parameter must have
        handed over a gradient (or be marked unused) so the plan can complete."""
        if not self.current.open:
            return
        self.current.open = False
        self.planner.record(self.current.timing, self.round)
        missing = [i for i in range(len(self.params)) if self.exchange.ready_round[i] != self.round]
        if missing and self.unused is None:
            names = [self.names[i] for i in missing[:5]]
            self._broken = True  # this round can never complete: close() must not wait for it
            raise GradschedError(
                f"{len(missing)} parameters got no gradient in this backward pass, e.g. {names}; if some "
                f"parameters are legitimately unused, pass find_unused_parameters=True to {self.entry}"
            )
        if self.unused is not None and self.unused.open:  # the backward pass ended early (it raised)
            self._settle_unused()
        self._detect_orphans()

    def _settle_unused(self) -> None:
        """``find_unused_parameters``: the backward pass is over, so every parameter it gave no
        gradient is handed over now (see :mod:`gradsched.runtime.unused`)."""
        self._globally_unused = self._agree_unused(self.unused.settle(len(self.params)))
        for i in [i for i in range(len(self.params)) if self.exchange.ready_round[i] != self.round]:
            p = self.params[i]
            if self.exchange.in_flight(i) or self.updates.pending(i):  # its previous round first
                self.updates.wait_and_apply([i], f"parameter {self.names[i]!r}")
            home = self.current.homes.get(i)
            held = plain(p.grad)
            if i in self._globally_unused:  # used nowhere: .grad stays as it is
                if home is not None and held is home:  # .grad lives where the message reduces: restored after
                    self.handover.hand_over(i, home, self.round, keep=home.clone())
                else:
                    self.exchange.mark_ready(i, home.zero_() if home is not None else torch.zeros_like(p), self.round)
                continue
            with torch.no_grad():  # used elsewhere: reduced with what this rank holds, as DDP does
                if held is None:
                    contribution = home.zero_() if home is not None else torch.zeros_like(p)
                elif home is not None:
                    contribution = home if held is home else home.copy_(held)
                else:
                    contribution = held.detach().contiguous()
            self.handover.hand_over(i, contribution, self.round, self.current.grad_scale)

    def _agree_unused(self, missing: list[int]) -> set[int]:
        return agree_unused(missing, len(self.params), self.topology.control if self.world_size > 1
                            else None, self.peers.explain)

    def _detect_orphans(self) -> None:
        """Parameters that got a gradient though no module owning them ran are waited for by an
        ancestor that ran (:mod:`gradsched.runtime.waits`)."""
        if not self.current.forward_ran:
            return
        self.current.forward_ran = False
        self.waits.adopt_orphans(lambda i: self.exchange.ready_round[i] == self.round, self.current.ran,
                                 lambda i, module: self.planner.adopt(self.names[i], module))

    # -- optimizer entry points -----------------------------------------------------------
    def check_in_use(self, what: str) -> None:
        """Raise if a later wrap of the same model took over from this one."""
        if self.replaced:
            raise GradschedError(f"{what}: the model was wrapped again since; a later gradsched.wrap or "
                                 "gradsched.DistributedDataParallel of the same model took over: use what it returned")

    def step(self) -> None:
        self.check_in_use("optimizer.step()")
        if self.reducer is not None:  # DDP's reducer finished every reduction inside backward
            self.updates.apply_now(range(len(self.params)), self.updates.snapshot())
            return
        self._close_round()
        snapshot = self.updates.snapshot()
        if not self.exchange.plan_for(self.round).cross_barrier:  # like DDP: wait, then update all
            self.synchronize()
            self.updates.apply_now(range(len(self.params)), snapshot)
        else:
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None and i not in self._globally_unused]
            self.updates.request_step(with_grad, snapshot)
        if not self.uneven.enabled:  # inside join(): at the next announcement (gradsched.runtime.join)
            self.planner.control_point(self.round)
        if self._hand_off:
            self._hand_off_buckets()

    def step_unscheduled(self) -> None:
        """Step the optimizer's parameters outside the plans (:meth:`DeferredUpdates.step_others`)."""
        self.updates.step_others(self.index)

    def _buckets_kept(self) -> None:  # every rank, one control point; inside join() no rank steps at one point
        self._hand_off = hands_off(self.config, self.world_size) and not self.uneven.enabled

    def _hand_off_buckets(self) -> None:
        """DDP's C++ reducer reduces from the next backward pass on (:mod:`gradsched.runtime.handoff`)."""
        self._hand_off = False
        self.synchronize()
        self._detach_hooks()  # gradsched's own: off the training thread's path from now on
        self._release_buffers()
        self.reducer = TorchReducer(self.model, self.topology.data, self.config, syncing=self.sync.enabled,
                                    comm_hook=self.comm_hook)
        self.handed_off_round, self.uneven = self.round + 1, self.reducer.ddp  # join(): DDP's own

    def _release_buffers(self) -> None:
        """Let go of gradsched's flat gradient buffers (DDP's buckets hold the gradients from the
        hand-off on): a gradient that lives in one moves to memory of its own."""
        homes = {h.data_ptr() for h in self.current.homes.values()}
        for p in self.params:
            if p.grad is not None and p.grad.data_ptr() in homes:
                p.grad = p.grad.clone()
        self.current.homes = {}
        self.exchange.release_buffers()

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply ``optimizer`` from now on (the model was wrapped before it existed)."""
        self.optimizer = self.updates.optimizer = optimizer

    def zero_grad(self, set_to_none: bool) -> None:
        self.check_in_use("zero_grad()")
        self.updates.request_zero(set_to_none)
        # parameters the optimizer knows but gradsched does not communicate (frozen ones)
        for group in self.optimizer.param_groups if self.optimizer is not None else []:
            for p in group["params"]:
                if id(p) not in self.index:
                    clear_grad(p, set_to_none)

    def clip_grad_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                       foreach: bool | None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the reduced gradients: waits for every reduction."""
        self._require_gradients("clip_grad_norm_")
        return self.handover.clip_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_grad_value(self, clip_value: float) -> None:
        """Clamp every gradient, each once its reduction is complete (nothing waits now)."""
        self._require_gradients("clip_grad_value_")
        self.handover.clip_value(clip_value)

    def _require_gradients(self, what: str) -> None:
        if self.round == 0:
            raise GradschedError(f"{what}: no backward pass has run yet: clip after loss.backward(), before step()")

    def synchronize(self) -> None:
        if self._closed or self.reducer is not None:
            return
        self.buffer_sync.wait()
        self._close_round()
        self.updates.wait_and_apply(range(len(self.params)), "all parameters")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.check_in_use("no_sync()")
        self.sync.depth += 1
        if self.reducer is not None:  # handed off: DDP's no_sync
            self.reducer.sync(False)
        try:
            yield
        finally:
            self.sync.depth -= 1
            if self.reducer is not None:
                self.reducer.sync(self.sync.enabled)

    def set_backward_sync(self, enabled: bool) -> None:
        """DDP's ``require_backward_grad_sync = enabled``: read by each later forward pass."""
        self.sync.backward = bool(enabled)
        if self.reducer is not None:
            self.reducer.sync(self.sync.enabled)

    # -- reporting and teardown ------------------------------------------------------------
    def export_profile(self, path: str, name: str) -> str:
        return self.planner.export_profile(path, name)

    def stats(self) -> RunStats:
        plan = self.exchange.plan_for(self.round + 1)
        est = self.exchange.estimator
        planner = self.planner
        rounds = self.round + (self.reducer.rounds if self.reducer is not None else 0)
        exposure = self.exposure.summary() or (None, None, None)
        return RunStats(self.policy.name, rounds, len(plan.messages), self.exchange.plans_adopted, est.latency,
                        est.bytes_per_second, plan.policy, planner.settled_round, planner.prediction, planner.trial,
                        planner.tuning, list(planner.switches), self.handed_off_round, *exposure)

    def broadcast_buffers(self, source: int = 0) -> None:
        """Copy rank ``source``'s buffers (BatchNorm statistics) to every worker: under way on
        return, waited for by the forward passes that read them (gradsched.runtime.buffer_sync)."""
        self.buffer_sync.start(source)

    def broadcast_model(self, source: int) -> None:
        """Copy rank ``source``'s parameters (and buffers, unless buffers are not synced) to every worker."""
        self.buffer_sync.wait()
        broadcast_model(self.model, self.config.broadcast_buffers, source, self.topology.buffers, self.explain)

    def _status(self) -> Status:
        """This rank's progress, for a rank whose communication failed (gradsched.runtime.peer_status)."""
        joined = self.reducer is None and self.uneven.joined  # handed off: DDP's join
        state = "closed" if self._closed else "joined" if joined else "training"
        began = self.current.next_begins and self.current.forward_ran and state == "training"  # a forward pass
        return Status(self.round + int(began), state, time.monotonic() - self._active_at)

    def idle(self) -> bool:
        """Nothing failed and no gradient handed over is still being communicated."""
        return self.exchange.error is None and not self._broken and not any(map(self.exchange.in_flight,
                                                                                 range(len(self.params))))

    def _detach_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _abandon(self) -> None:
        """Undo a construction that failed half-way: the hooks attached, the threads started."""
        self._closed = True
        self._detach_hooks()
        if hasattr(self, "peers"):
            self.peers.stop()
        self.exchange.close(wait=False)

    def close(self, wait: bool = True) -> None:
        """Detach and stop; with ``wait``, first finish the communication in flight."""
        if self._closed:
            return
        try:
            if wait and not self._broken and self.exchange.error is None:
                self.synchronize()
        finally:
            self._closed = True
            if self.reducer is not None:
                self.reducer.close()
                self.uneven = UnevenInputs(self)  # let go of DDP (and through it of the model)
            self._active_at = time.monotonic()
            self.peers.close(self._status())
            self._detach_hooks()
            if self.unused is not None:
                self.unused.close()
            for release in self.on_close:  # what the objects users hold let go of (DistributedDataParallel's)
                release()
            self.buffer_sync.close()
            self.exchange.close(wait=wait)  # every object lets go of the groups it used
            self.planner.close()
            self.topology.release()
            if self.trace:
                self.trace.save(self.config.trace)
