"""Discrete-event simulation of data-parallel training under a scheduling policy.

The simulator feeds the SAME :class:`~gradsched.core.Scheduler` and policy objects the
runtime plans with, from the event loop (:mod:`gradsched.sim.events`, shared with plan
making) instead of autograd hooks:

* forward of layer i in iteration k starts when layer i-1's forward ended and, for
  iterations after the first, when the parameters it needs are updated: its own layer's
  tensors for policies that cross the iteration barrier, ALL tensors otherwise (fifo);
* backward runs layers in reverse; when layer i's backward ends its gradients become
  ready (one ``on_ready`` per tensor, in reverse parameter order, as autograd does);
* the next forward starts after the backward ends; parameter updates take no time;
* messages the engine launches go to the network model (:mod:`gradsched.sim.network`)
  and come back as ``on_finished`` when they complete;
* ``arch="sharded"`` (as the runtime's ``architecture="sharded"`` runs it): the engine's
  messages are reduce-scatters; once the backward pass has ended and every one of them is
  complete (the step), each message is all-gathered in turn, the first layers' first, and
  a layer's forward starts once its own parameters are back;
* ``arch="fully_sharded"``: the engine's messages are reduce-scatters, and every layer's
  parameters are gathered before its forward and again before its backward pass by the
  runtime's gather queue (:mod:`gradsched.sim.gathering`), on the same link: one schedule,
  the gathers due when a layer's gradients are computed submitted before the policy's
  reduce-scatters of them (the runtime's gathers-first rule); a backward layer waits for its
  parameters;
* ``hold_bytes`` (the sharded architectures' gradient budget, ``gradient_budget_mb``): a
  message carries at most half of it of whole gradients, and after a layer's gradients are
  handed over the backward pass waits while the gradients not yet reduced (queued, or in a
  message in flight) exceed it and a message in flight will end, as the runtime's hand-over
  waits.

>>> from gradsched.models.table import Layer, ModelTable, ParamSpec
>>> from gradsched.core.policies import FifoConfig
>>> model = ModelTable("tiny", tuple(
...     Layer(f"l{i}", 1.0, 1.0, (ParamSpec(f"w{i}", 750),)) for i in range(3)))
>>> cluster = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0)  # 3 s per gradient
>>> one_per_bucket = FifoConfig(bucket_cap_bytes=1, first_bucket_bytes=1)
>>> simulate(model, cluster, one_per_bucket, iterations=5).iteration_s
13.0
>>> r = simulate(model, cluster, "priority", iterations=5)
>>> r.iteration_s, r.bound_s, r.iteration_starts
(12.0, 9.0, [0.0, 10.0, 22.0, 34.0, 46.0])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import Scheduler, policy_config
from ..core.engine import default_hold, message_hold
from ..core.base import PolicyConfig
from ..models.table import ModelTable
from .bounds import bound, dependency_bound
from .cluster import Cluster
from .driver import Cause, Driver, Launched
from .events import Event, EventLoop, Kind
from .gathering import UnitGathers, table_units
from .network import Segment, Transfer, make_network


@dataclass(frozen=True)
class MessageRecord:
    id: int
    iteration: int
    names: tuple[str, ...]
    nbytes: int
    launched: float
    segments: tuple[Segment, ...]
    completed: float


@dataclass(frozen=True)
class ComputeRecord:
    iteration: int
    layer: str
    phase: str  # "forward" or "backward"
    start: float
    end: float


@dataclass
class SimResult:
    """Outcome of one simulation. Times in seconds."""

    model: str
    policy: str
    config: dict[str, Any]
    cluster: Cluster
    iterations: int
    warmup: int  # leading iteration periods left out of the steady-state figures
    iteration_s: float  # steady-state time per iteration
    compute_s: float  # forward + backward of one worker
    comm_s: float  # all gradient bytes once at link speed
    dependency_bound_s: float  # the bound that also respects when gradients exist and are needed (sim.bounds)
    link_utilisation: float  # busiest lane's busy fraction over the steady-state window
    iteration_starts: list[float]  # forward start of layer 0, per iteration
    backward_starts: list[float]  # per iteration; steady-state figures are measured between these
    log: list[tuple] = field(repr=False)  # (time, event, iteration, subject) in processing order
    messages: list[MessageRecord] = field(repr=False)  # every message, in completion order
    compute: list[ComputeRecord] = field(repr=False)  # empty unless recorded
    engine: Scheduler = field(repr=False)  # the engine after the run: its policy, estimator, plan

    @property
    def bound_s(self) -> float:
        return bound(self.compute_s, self.comm_s)

    @property
    def ratio_to_bound(self) -> float:
        return self.iteration_s / self.bound_s if self.bound_s > 0 else float("nan")

    @property
    def window(self) -> tuple[float, float]:
        """The steady-state window the figures are measured over: from the start of backward
        of the first iteration after warm-up to the start of backward of the last one.

        Backward starts, not forward starts: each iteration's communication lies between
        its own backward start and the next one, so every single period, not only their
        mean, is at least max(compute, communication)."""
        return self.backward_starts[self.warmup], self.backward_starts[-1]


def simulate(
    model: ModelTable,
    cluster: Cluster,
    policy: PolicyConfig | str,
    iterations: int = 30,
    record: bool = True,
    gather_budget_bytes: int | None = None,
    gathers_first: bool = True,
    hold_bytes: int | None | str = "default",
) -> SimResult:
    """Simulate ``iterations`` training iterations; see the module docstring. Under
    ``arch="fully_sharded"``: ``gather_budget_bytes`` is ``gather_budget_mb`` in bytes (None: the
    runtime's default), and ``gathers_first=False`` hands a layer's gradients to the policy
    before the gathers its freeing lets go (what the runtime did before its gathers-first rule).
    ``hold_bytes``: a sharded rank's gradient budget in bytes (see above; ``"default"``: the
    runtime's, :func:`~gradsched.core.engine.default_hold`, where the architecture is sharded;
    None: no bound)."""
    if gather_budget_bytes is not None and not cluster.kind.gathers:
        raise ValueError(f"a gather budget applies to Cluster(arch='fully_sharded'), got {cluster.arch!r}")
    config = policy_config(policy) if isinstance(policy, str) else policy
    if hold_bytes == "default":
        sizes = [p.nbytes for layer in model.layers for p in layer.params]
        hold_bytes = default_hold(sizes) if cluster.kind.phases else None
    if hold_bytes is not None and not cluster.kind.phases:
        raise ValueError(f"a gradient budget applies to the sharded architectures, got {cluster.arch!r}")
    return _Run(model, cluster, config, iterations, record, gather_budget_bytes, gathers_first, hold_bytes).run()


class _Run:
    def __init__(self, model: ModelTable, cluster: Cluster, config: PolicyConfig, iterations: int, record: bool,
                 gather_budget_bytes: int | None = None, gathers_first: bool = True, hold_bytes: int | None = None):
        self.model = model
        self.cluster = cluster
        # sizes derived from the link averaged over the clock (a link slower in bursts)
        config = config.for_link(model.gradient_bytes, cluster.latency_s,
                                 cluster.phase_seconds_per_byte * cluster.mean_factor, cluster.overhead_s)
        self.config = config
        self.policy = config.build()
        self.warmup = max(1, self.policy.warmup_iterations)
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < self.warmup + 2:
            raise ValueError(
                f"iterations must be >= {self.warmup + 2} for policy {config.name!r} "
                f"({self.warmup} warm-up), got {iterations!r}"
            )
        self.iterations = iterations
        self.record = record
        tensors = model.tensors()
        self.engine = Scheduler(tensors, self.policy, message_hold(hold_bytes))
        self.hold_bytes = hold_bytes
        self.network = make_network(cluster)
        self.layers = model.layers
        self.layer_of = {t.name: t.layer for t in tensors}
        self.layer_size = [len(layer.params) for layer in self.layers]
        # reverse parameter order within a layer, as autograd accumulates them
        self.ready_order = [tuple(p.name for p in reversed(layer.params)) for layer in self.layers]
        self.n_tensors = len(tensors)
        # tensors of the latest iteration whose communication is not finished
        self.pending = [0] * len(self.layers)
        self.pending_total = 0
        self.loop = EventLoop()
        self.driver = Driver(self.engine, self.network, self.loop, self.on_launch if record else None)
        self.iteration = 0  # iteration whose forward runs or is next
        self.next_layer = 0  # next layer to run forward
        self.cursor = 0.0  # when the forward chain is free again
        self.starts: list[float] = []
        self.backward_starts: list[float] = []
        self.log: list[tuple] = []
        self.messages: list[MessageRecord] = []
        self.compute: list[ComputeRecord] = []
        self.sharded = cluster.kind.phases
        self.reduced: list[tuple[tuple[str, ...], int]] = []  # sharded: this round's messages, done
        self.gathered = [0.0] * len(self.layers)  # sharded: when each layer's parameters are back
        self.gathered_for = 0  # sharded: the iteration whose all-gathers are on the link
        self.gathers = (UnitGathers(table_units(model, gather_budget_bytes), self.network, self.on_gather)
                        if cluster.kind.gathers else None)  # fully sharded: the gather queue on the link
        #: fully sharded: each layer with parameters -> its unit (the gathers' own, by its first parameter)
        self.unit_of = {} if self.gathers is None else {
            i: self.gathers.unit_of[layer.params[0].name] for i, layer in enumerate(self.layers) if layer.params}
        self.gathers_first = gathers_first
        #: the backward pass runs layer by layer on events (else it is laid out at once): its layers
        #: wait for their gathers, or for the gradient budget
        self.chained = self.gathers is not None or hold_bytes is not None
        self.blocked: int | None = None  # chained: the layer whose backward pass waits for the budget

    # -- events --------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.advance_forward(0.0)
        self.loop.run(self.handle)
        return self.result()

    def handle(self, event: Event) -> None:
        now = event.time
        if event.kind == Kind.COMPLETE:
            self.on_complete(event.payload, now)
        elif event.kind == Kind.SENT:
            self.driver.sent(event.payload)
        elif event.kind == Kind.READY:
            if self.gathers is not None and self.gathers_first:  # its unit freed: the gathers that lets go first
                self.gathers.free(self.unit_of[event.payload], now)
            for name in self.ready_order[event.payload]:
                if self.record:
                    self.log.append((now, "ready", self.engine.iteration, name))
                self.driver.ready(name)
            if self.gathers is not None and not self.gathers_first:
                self.gathers.free(self.unit_of[event.payload], now)
            if self.chained:
                if self.over_budget():
                    self.blocked = event.payload - 1
                else:
                    self.backward_from(event.payload - 1, now)
        elif event.kind == Kind.FORWARD:
            self.iteration += 1
            if self.iteration < self.iterations:
                self.next_layer = 0
                self.cursor = now
                self.advance_forward(now)
        else:
            self.on_backward(now)

    # -- compute -------------------------------------------------------------------------
    def deps_done(self, layer: int) -> bool:
        if self.policy.cross_barrier and not self.sharded:
            return self.pending[layer] == 0
        return self.pending_total == 0

    def gather(self, now: float) -> None:
        """Sharded: the step is now; every message of the round all-gathered in turn, those of
        the first layers first (fully sharded: the gather queue's forward pass begins)."""
        self.gathered_for = self.iteration
        if self.gathers is not None:
            self.gathers.begin_forward(now)
            return
        self.gathered = [now] * len(self.layers)
        order = sorted(self.reduced, key=lambda m: min(self.layer_of[n] for n in m[0]))
        for names, nbytes in order:
            transfer = self.network.submit(nbytes, now)
            for name in names:
                layer = self.layer_of[name]
                self.gathered[layer] = max(self.gathered[layer], transfer.complete)
            self.messages.append(MessageRecord(-1, self.iteration, names, nbytes, now, transfer.segments,
                                               transfer.complete))
        self.reduced = []

    def advance_forward(self, now: float) -> None:
        """Run forward layers ahead in time while their parameters are ready. A layer whose
        update is still in flight blocks the chain until a completion resumes it."""
        layers = self.layers
        while self.next_layer < len(layers):
            i = self.next_layer
            if not self.deps_done(i):
                return
            if self.sharded and self.iteration > self.gathered_for:
                self.gather(now)
            if self.gathers is not None:
                start = self.gathers.need(self.unit_of.get(i), max(self.cursor, now))
            else:
                start = max(self.cursor, now, self.gathered[i] if self.sharded else 0.0)
            if i == 0:
                self.starts.append(start)
                if self.record:
                    self.log.append((start, "forward", self.iteration, layers[0].name))
            self.cursor = start + layers[i].forward_s
            if self.record:
                self.compute.append(ComputeRecord(self.iteration, layers[i].name, "forward", start, self.cursor))
            if self.gathers is not None:
                self.gathers.free(self.unit_of.get(i), self.cursor, forward=True)
            self.next_layer += 1
        if self.gathers is not None:
            self.gathers.end_forward(self.cursor)
        self.loop.schedule(self.cursor, Kind.BACKWARD)
        self.next_layer += 1  # past the end: nothing left to resume

    def on_backward(self, now: float) -> None:
        self.backward_starts.append(now)
        self.engine.begin_iteration(now)
        if self.record:
            self.log.append((now, "backward", self.iteration, None))
        self.pending = list(self.layer_size)
        self.pending_total = self.n_tensors
        if self.chained:
            self.backward_from(len(self.layers) - 1, now)
            return
        t = now
        for i in range(len(self.layers) - 1, -1, -1):
            end = t + self.layers[i].backward_s
            if self.record:
                self.compute.append(ComputeRecord(self.iteration, self.layers[i].name, "backward", t, end))
            if self.layer_size[i]:
                self.loop.schedule(end, Kind.READY, i)
            t = end
        self.loop.schedule(t, Kind.FORWARD)

    def backward_from(self, i: int, now: float) -> None:
        """The backward pass from layer ``i`` down (fully sharded: each layer once its parameters
        are whole), up to the next layer whose gradients become ready (an event: what they let go
        on the link comes first, and the budget may hold the pass there)."""
        t = now
        while i >= 0:
            start = self.gathers.need(self.unit_of.get(i), t) if self.gathers is not None else t
            end = start + self.layers[i].backward_s
            if self.record:
                self.compute.append(ComputeRecord(self.iteration, self.layers[i].name, "backward", start, end))
            if self.layer_size[i]:
                self.loop.schedule(end, Kind.READY, i)
                return
            t, i = end, i - 1
        self.loop.schedule(t, Kind.FORWARD)

    def over_budget(self) -> bool:
        """Whether the backward pass waits for the gradient budget: more bytes not yet reduced
        than it allows, and a message in flight whose end lets some go."""
        engine = self.engine
        return (self.hold_bytes is not None and engine.in_flight_count > 0
                and engine.held_bytes() + engine.in_flight_bytes > self.hold_bytes)

    # -- communication ---------------------------------------------------------------------
    def on_gather(self, names: tuple[str, ...], nbytes: int, at: float, transfer: Transfer) -> None:
        self.messages.append(MessageRecord(-1, self.iteration, names, nbytes, at, transfer.segments, transfer.complete))

    def on_launch(self, launched: Launched, cause: Cause) -> None:
        message = launched.message
        self.log.append((message.launched_at, "launch", message.iteration, tuple(message.names)))

    def on_complete(self, launched: Launched, now: float) -> None:
        message, transfer = launched
        names = tuple(message.names)
        if self.record:
            self.log.append((now, "done", message.iteration, names))
        self.messages.append(
            MessageRecord(
                message.id, message.iteration, names, message.nbytes, message.launched_at, transfer.segments, now
            )
        )
        if self.sharded and self.gathers is None:  # (fully sharded gathers units, not messages)
            self.reduced.append((tuple(task.tensor.name for task in message.tasks), message.nbytes))
        decision = self.driver.complete(launched)
        for name in decision.done:
            self.pending[self.layer_of[name]] -= 1
        self.pending_total -= len(decision.done)
        if self.blocked is not None and not self.over_budget():
            resume, self.blocked = self.blocked, None
            self.backward_from(resume, now)
        if self.next_layer < len(self.layers):
            self.advance_forward(now)

    # -- figures -------------------------------------------------------------------------
    def result(self) -> SimResult:
        starts = self.backward_starts
        lo, hi = starts[self.warmup], starts[-1]
        periods = len(starts) - 1 - self.warmup
        busy = {lane: 0.0 for lane in self.network.lanes}
        for record in self.messages:
            for seg in record.segments:
                if seg.lane in busy:  # the wire's lanes, not compression's casts
                    busy[seg.lane] += max(0.0, min(seg.end, hi) - max(seg.start, lo))
        utilisation = max(busy.values()) / (hi - lo) if hi > lo else float("nan")
        return SimResult(
            model=self.model.name,
            policy=self.config.name,
            config=self.config.as_dict(),
            cluster=self.cluster,
            iterations=self.iterations,
            warmup=self.warmup,
            iteration_s=(hi - lo) / periods,
            compute_s=self.model.compute_s,
            comm_s=self.cluster.comm_time(self.model.gradient_bytes),
            dependency_bound_s=dependency_bound(self.model, self.cluster.comm_time),
            link_utilisation=utilisation,
            iteration_starts=self.starts,
            backward_starts=starts,
            log=self.log,
            messages=self.messages,
            compute=self.compute,
            engine=self.engine,
        )
