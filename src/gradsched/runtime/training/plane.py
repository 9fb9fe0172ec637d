"""gradsched's own reduction backend: the training thread's side of every round on gradsched's
data plane (:mod:`gradsched.runtime.comm`), both passes, one object:

* backward hands each gradient over as autograd accumulates it (a post-accumulate-grad hook per
  parameter: moved into its home in the plan's flat buffer, stamped with the clock's event, left
  in ``.grad`` in flight); the first gradient after a forward pass opens the round; with
  ``find_unused_parameters`` the last gradient the backward pass gives (or its close) settles
  the parameters it left without one, as DDP does (:mod:`gradsched.runtime.training.unused`);
  a rank that has joined (``join()``) hands over zeros for a round it shadows;
* a forward pre-hook per module that owns parameters waits for those parameters' reduction
  and applies every pending update (the Dependency Proxy: a layer waits only for itself), and
  one per module that owns buffers waits for their broadcast;
* the root module's forward pre-hook closes the previous round, starts the buffer broadcast
  and runs the control point of a round no ``step()`` followed;
* ``step()`` closes the round and updates each parameter once its reduction is complete.

What differs between all-reduce, parameter servers and sharded (what travels, how, and what
``step()``, a module's forward pass and clipping do with the result) is the architecture's
(:class:`~gradsched.runtime.training.architecture.Architecture`, its
:class:`~gradsched.runtime.training.architecture.Stepping`); this module asks none of them which
it is. It borrows the run's record (:class:`~gradsched.runtime.training.run.Run`: the rounds, the
switches, the optimizer's applier, what is measured) and owns what dies with it: the exchange
and its threads, the flat buffers, the planner, the hooks. The coordinator holds it until the
hand-off to DDP's reducer (:mod:`gradsched.runtime.architectures.reducer`), which retires it
whole (:meth:`Plane.retire`): nothing refers to it afterwards. Every
wait for a reduced gradient goes through the handover
(:meth:`gradsched.runtime.training.inflight.Handover.wait`).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
from torch import nn

from gradsched.runtime.comm.broadcast import broadcast_model
from gradsched.runtime.config import Environment
from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.training.dataplane import open_data_plane
from gradsched.runtime.diagnostics.exposure import say_exposure
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.planning.planner import Planner
from gradsched.runtime.planning.profiling import RoundTiming
from gradsched.runtime.training.buffer_sync import BufferSync
from gradsched.runtime.training.hooks import Hook
from gradsched.runtime.training.inflight import Handover, plain
from gradsched.runtime.training.join import Iteration, UnevenInputs
from gradsched.runtime.training.rounds import Round
from gradsched.runtime.training.run import Run
from gradsched.runtime.training.sparse import SparseGradients
from gradsched.runtime.training.stand_ins import StandIns
from gradsched.runtime.training.unused import UnusedParameters
from gradsched.runtime.training.waits import ModuleWaits


class Plane:
    """The round on gradsched's data plane under ``architecture``, for the run ``run`` (whose
    record it borrows: what it builds here dies with it)."""

    def __init__(self, run: Run, architecture: Architecture) -> None:
        self.run, self.architecture = run, architecture
        opened = open_data_plane(architecture, run, run.trace.on_exchange if run.trace else None)
        self.tensors, self.exchange = opened.tensors, opened.exchange
        try:  # the launcher runs: nothing of a half-built plane may outlive it
            self._build(run, architecture)
        except BaseException:
            self.exchange.close(wait=False)
            raise

    def _build(self, run: Run, architecture: Architecture) -> None:
        config, topology = run.config, run.topology
        self.current = Round(run.life)  # the run's: the count goes on after a hand-off
        self.closed = False
        self._stepped_after = 0  # the round the latest step() followed
        self.broken = False  # a round that can never complete: close() must not wait for it
        self.handover = Handover(run.params, self.exchange)
        run.updates.serve(self.handover)  # the run's optimizer applier waits for this plane's reductions
        self.stepping = architecture.stepping(self.exchange, self.handover, run.updates, topology, config)
        self.sparse = SparseGradients(*run.sparse, topology, run.explain)  # outside the plans (training.sparse)
        self.unused = UnusedParameters(run.params) if config.find_unused_parameters else None
        self.stand_ins = StandIns(run, self.current, self.exchange, self.handover, self.unused, self.sparse)
        refusal = architecture.join_refusal
        self.uneven = UnevenInputs(self, run, refusal and f"{architecture!r} does not support uneven inputs yet "
                                   f"({refusal})")  # join(): ranks with fewer batches shadow the others
        self.waits = ModuleWaits(run.model, run.index)  # the Dependency Proxy's map (gradsched.runtime.training.waits)
        on_plane = architecture.buffers_on_data_plane
        self.buffer_sync = BufferSync(run.model, self.exchange,
                                      partial(getattr, topology, "broadcasts" if on_plane else "buffers"),
                                      on_plane, run.explain, run.device, partial(getattr, topology, "control"))
        self.planner = Planner(self.tensors, run.params, run.policy, config, architecture.link_model(),
                               self.waits.owners(run.names), self.exchange, topology.control, self.run.rank,
                               self.run.world_size, topology.data, run.clock,
                               settle=partial(self.handover.wait, range(len(run.params)), "all parameters"),
                               measured=run.measured, gathers=self.stepping.gather_model, trace=run.trace,
                               ranks_per_host=Environment.read().ranks_per_host)
        self._handles: list[Any] = []

    # -- what join asks (gradsched.runtime.training.join.Joining) -------------------------------
    def control_point(self, round_index: int) -> None:
        """Hold the control point after round ``round_index``; where the measured trial keeps the
        buckets (outside ``join()``, where no rank steps at one point), the hand-off is due."""
        self.planner.control_point(round_index)
        if self.planner.kept_buckets:
            self.planner.kept_buckets = False
            self.run.handoff_due |= not self.uneven.enabled

    def broadcast_model(self, source: int) -> None:
        """Copy rank ``source``'s parameters (and buffers, unless buffers are not synced) to every worker."""
        self.synchronize()
        broadcast_model(self.run.model, self.run.config.broadcast_buffers, source, self.run.topology.buffers,
                        self.run.explain)

    # -- the backend's interface (the coordinator's calls) ------------------------------------
    @property
    def round(self) -> int:
        """The latest round begun (backward pass that communicates), numbered from 1."""
        return self.current.index

    @property
    def joined(self) -> bool:
        return self.uneven.joined

    def forward_param_sync(self, enabled: bool | None = None) -> bool:
        """DDP's ``require_forward_param_sync`` (set it with ``enabled``)."""
        if enabled is not None:
            self.run.sync.param = bool(enabled)
        return self.run.sync.param

    def set_sync(self, enabled: bool) -> None:
        """Nothing: the switches are read by each forward pass (gradsched.runtime.training.syncing)."""

    def opened_in_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Nothing: the plane is opened by the wrap, before any forward pass."""

    def attach(self) -> None:
        """Register the hooks of gradients, sparse gradients and modules."""
        for p in self.run.params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._handles.extend(self.sparse.attach(self._on_sparse_grad))
        self._handles.append(self.run.model.register_forward_pre_hook(Hook(self._before_root)))
        self._handles.append(self.run.model.register_forward_hook(Hook(self._after_root)))
        for module in self.run.model.modules():
            if module in self.waits.hooked or module in self.buffer_sync.owners:
                self._handles.append(module.register_forward_pre_hook(Hook(self._before_module)))
        self._handles.extend(self.stepping.attach(self.run.params, self.waits))  # run after the plane's own

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def step(self) -> None:
        """``optimizer.step()``: close the round; update each parameter once it is reduced."""
        self.close_round()
        reduced, self._stepped_after = self.round != self._stepped_after, self.round
        self.stepping.step(self.run.updates.snapshot(), self.exchange.plan_for(max(self.round, 1)), reduced)  # (0:
        #   gradients set by hand before any backward pass: nothing in flight, the first round's plan as good as any)
        self.current.life.stepped()
        if not self.uneven.enabled:  # inside join(): at the next announcement (gradsched.runtime.training.join)
            self.control_point(self.round)

    def synchronize(self) -> None:
        """Every reduction complete and every pending update applied."""
        if self.closed:
            return
        self.buffer_sync.wait()
        self.close_round()
        self.run.updates.wait_and_apply(range(len(self.run.params)), "all parameters")
        self.stepping.synchronize()

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        return self.stepping.clip_norm(max_norm, norm_type, error_if_nonfinite, foreach)

    def clip_value(self, value: float) -> None:
        self.stepping.clip_value(value)

    def full_state_dict(self, rank0_only: bool) -> dict:
        return self.stepping.full_state_dict(rank0_only)

    def state_saved(self, state_dict: dict) -> None:
        self.stepping.state_saved(state_dict)

    def state_loading(self, state_dict: dict) -> None:
        self.stepping.state_loading(state_dict)

    def broadcast_buffers(self, source: int) -> None:
        """Copy rank ``source``'s buffers to every worker: under way on return (:class:`BufferSync`)."""
        self.buffer_sync.start(source)

    def idle(self) -> bool:
        return self.exchange.error is None and not self.broken and not any(map(self.exchange.in_flight,
                                                                               range(len(self.run.params))))

    def retire(self) -> None:
        """The hand-off (every reduction complete): off the training thread's path, the threads
        stopped, the flat gradient buffers let go: a gradient that lives in one moves to memory
        of its own, chunk by chunk (:mod:`gradsched.runtime.comm.layout`), so that the
        gradients are never held twice (DDP's bucket views take them in next). What it planned
        and measured stays readable; the optimizer's updates stay in use (the reducer's)."""
        chunks = self._living_in_homes()
        self.current.homes = {}
        self.close(wait=True)
        self.stop(wait=True)  # nothing of the plane refers to the buffers now but the gradients
        for members in chunks:
            for i in members:  # the chunk is freed with its last gradient moved
                p = self.run.params[i]
                p.grad = plain(p.grad).clone()

    def _living_in_homes(self) -> list[list[int]]:
        """The parameters whose ``.grad`` lives in a chunk of the flat buffers, chunk by chunk
        (indices only: nothing here keeps a chunk alive)."""
        chunks: dict[int, list[int]] = {}
        for i, home in self.current.homes.items():
            grad = plain(self.run.params[i].grad)
            if grad is not None and grad.untyped_storage().data_ptr() == home.untyped_storage().data_ptr():
                chunks.setdefault(home.untyped_storage().data_ptr(), []).append(i)
        return list(chunks.values())

    def close(self, wait: bool) -> None:
        """Stop; with ``wait`` (and nothing failed), first finish the communication in flight."""
        try:
            if wait and not self.broken and self.exchange.error is None:
                self.synchronize()
                self.buffer_sync.drain()  # a broadcast issued ahead for a forward pass that will not come
        finally:
            self.closed = True
            self.detach()
            if self.unused is not None:
                self.unused.close()
            self.stepping.close(wait and not self.broken and self.exchange.error is None)

    def stop(self, wait: bool) -> None:
        """Stop the threads and let go of the groups (after :meth:`close`)."""
        self.buffer_sync.close()
        self.exchange.close(wait=wait)
        self.planner.close()
        self.run.updates.serve(None)  # the run's applier: no reductions of this plane's any more
        self.uneven.release()  # (it refers to this plane)

    # -- rounds ---------------------------------------------------------------------------
    def start_round(self) -> None:
        """The round ``current.index`` has just opened: where its gradients go."""
        self.current.homes = self.exchange.homes(self.current.index)

    def close_round(self) -> None:
        """The backward pass of the open round is over: every trainable parameter must have
        handed over a gradient (or be marked unused) so the plan can complete."""
        if not self.current.life.close():
            return
        self.run.sync.round_closed()
        self.planner.record(self.current.timing, self.round)
        missing = [i for i in range(len(self.run.params)) if self.exchange.ready_round[i] != self.round]
        if missing and self.unused is None:
            names = [self.run.names[i] for i in missing[:5]]
            self.broken = True
            raise GradschedError(
                f"{len(missing)} parameters got no gradient in this backward pass, e.g. {names}; if some "
                f"parameters are legitimately unused, pass find_unused_parameters=True to {self.run.entry}"
            )
        if self.unused is not None and self.unused.open:  # the backward pass ended early (it raised)
            self.stand_ins.settle_unused()
        if self.current.life.orphans_due():  # gradients whose owners did not run: an ancestor that ran waits
            self.waits.adopt_orphans(lambda i: self.exchange.ready_round[i] == self.round, self.current.ran,
                                     lambda i, module: self.planner.adopt(self.run.names[i], module))

    def shadow(self, iteration: Iteration) -> None:
        """On a rank that has joined: take part in one iteration of the ranks still training
        with zero gradients and no update (see :mod:`gradsched.runtime.training.join`)."""
        if self.run.config.broadcast_buffers and self.run.world_size > 1 and iteration.communicates:
            self.buffer_sync.start(iteration.source)
        if not iteration.communicates:
            return
        self.current.life.shadowed()
        self.start_round()
        self.stand_ins.shadow_with_zeros()

    # -- backward: each gradient as autograd accumulates it ------------------------------------
    def _on_sparse_grad(self, name: str, p: torch.Tensor) -> None:
        """A sparse gradient was accumulated: reduced now, unless this backward pass is local."""
        if not self.closed and not self.run.sync.local:
            self.sparse.reduce(name, p, self.current.grad_scale)

    def _on_grad(self, p: torch.Tensor) -> None:
        if self.closed:
            return
        i = self.run.index[id(p)]
        grad = plain(p.grad)  # None: an undefined gradient reached this parameter
        if self.run.sync.local:
            if self.unused is not None and grad is not None:
                self.unused.local_gradient(i)
            self.stepping.local_gradient(i)
            return
        if self.current.life.gradient():  # the first gradient after a forward pass: a new round
            self.start_round()
            if self.unused is not None:
                self.unused.begin()  # which parameters will this backward pass reach?
        elif self.exchange.ready_round[i] == self.current.index:  # a later backward pass over the same forward
            # pass (retain_graph): accumulated locally onto the reduced gradient, as DDP's reducer leaves it
            # once a backward pass has finished; the stepping waited for the reduction before autograd added
            self.stepping.accumulated(i)
            if self.unused is not None and grad is not None:
                self.unused.local_gradient(i)
            return
        if grad is not None:
            self._hand_over(i, grad)
        if self.unused is not None and self.unused.report(i, grad is not None):
            self.stand_ins.settle_unused()  # the last gradient this backward pass gives the model

    def _hand_over(self, i: int, grad: torch.Tensor) -> None:
        current = self.current
        name = self.run.names[i]
        grad = self.handover.place(grad, current.homes.get(i))
        timing, key = current.timing, ("ready", name)
        now = timing.ready[name] = self.run.clock.stamp(timing, key)  # its event: also where it was produced
        if self.run.trace:
            self.run.trace.ready(current.index, name, now, backward_from=timing.forward_end)
        self.handover.hand_over(i, grad, current.index, current.grad_scale,
                                produced=self.run.device.produced(timing.events.get(key), written=grad))

    # -- forward hooks --------------------------------------------------------------------
    def _before_root(self, module: nn.Module, args: Any) -> None:
        if self.closed:
            return
        self.close_round()
        if not self.exchange.plan_for(self.round + 1).cross_barrier:
            self.synchronize()
        else:  # a gradient no step claimed would have the next backward pass added to it while it is reduced
            unclaimed = [i for i in range(len(self.run.params)) if (i in self.handover.unsettled
                         or self.exchange.in_flight(i)) and not self.run.updates.pending(i)]
            if unclaimed:  # (on NCCL also once resolved: that is, queued)
                self.run.updates.wait_and_apply(unclaimed, "gradients accumulated without a step")
        self.current.life.forward()
        self.current.life.active_at = time.monotonic()
        if self.run.sync.training(torch.is_grad_enabled()):  # a training iteration begins
            self.run.exposure.iteration_began(time.perf_counter(), self.exchange.waited_s)
            if self.run.exposure.count % 50 == 0 and self.run.rank == 0:
                say_exposure(self.run.exposure, self.exchange.plan_for(self.round + 1).policy, self.run.measured.trial)
        self.current.grad_scale = None
        training, sync_buffers = self.run.sync.forward_began(torch.is_grad_enabled())
        source = 0
        if training and not self.uneven.enabled:  # a round no step() followed (no optimizer; two backward
            self.control_point(self.round)  # passes per step); inside join(): in announce()
        if self.uneven.enabled:  # the joined ranks shadow what the iteration says: buffers synced as it trains
            iteration = self.uneven.announce(self.round, training)
            source, self.current.grad_scale = iteration.source, self.uneven.grad_scale(iteration)
            sync_buffers = training
        if self.run.config.broadcast_buffers and self.run.world_size > 1 and sync_buffers:
            self.buffer_sync.start(source)
        self.current.ran.clear()
        self.current.timing = timing = RoundTiming()
        timing.forward_start = self.run.clock.stamp(timing, "forward_start")

    def _after_root(self, module: nn.Module, args: Any, output: Any) -> None:
        self.run.sync.forward_ended(torch.is_grad_enabled())
        run = self.run
        if run.config.broadcast_buffers and run.world_size > 1 and run.sync.param and not self.uneven.enabled:
            self.buffer_sync.ahead()  # the next forward pass's buffers: broadcast ahead of this round's messages
        self.current.timing.forward_end = self.run.clock.stamp(self.current.timing, "forward_end")
        if self.run.trace:
            self.run.trace.forward_ended(self.current.timing.forward_end)

    def _before_module(self, module: nn.Module, args: Any) -> None:
        if self.closed:
            return
        self.current.ran.add(id(module))
        self.buffer_sync.before(module)
        idx = self.waits.of.get(module)
        if not idx:
            return
        name = self.waits.name[module]
        timing = self.current.timing
        first = name not in timing.module_starts
        entered = time.perf_counter()
        if first:
            timing.module_starts[name] = self.run.clock.stamp(timing, ("module", name))
        if self.stepping.before_forward(idx, f"module {name}") and first:
            timing.module_waits[name] = time.perf_counter() - entered
        if self.run.trace:
            self.run.trace.module_forward(name or type(module).__name__, time.perf_counter(), entered)
