"""Making plans: the scheduler core run on predicted events, its launches recorded.

A :class:`~gradsched.core.plan.Plan` is the order every rank follows (see
:mod:`gradsched.core.plan`). It is made here by running the policy's engine on one
backward pass with the predicted ready time of every gradient, over the network model of
the simulator, on the same event loop and :class:`~gradsched.sim.driver.Driver` as the
simulator: what the simulator predicts for a policy is what the runtime's plans do.

>>> from gradsched.core import TensorSpec, policy_config
>>> tensors = [TensorSpec(f"w{i}", 1000, layer=i, priority=i) for i in range(3)]
>>> ready = {"w2": 0.0, "w1": 0.001, "w0": 0.002}  # each 4 ms on the wire at 1 us/byte
>>> plan = make_plan(tensors, ready, policy_config("priority"), seconds_per_byte=1e-6)
>>> [(m.slices[0][0], m.after_tensor, m.after_message) for m in plan.messages]
[('w2', 'w2', None), ('w0', None, 0), ('w1', None, 1)]
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..core import Scheduler
from ..core.base import PolicyConfig
from ..core.plan import Plan, PlannedMessage
from ..core.gathers import GatherModel
from ..core.task import TensorSpec
from .cluster import ARCHITECTURES
from .driver import Cause, Driver, Launched
from .events import Event, EventLoop, Kind
from .gathering import UnitGathers
from .network import network_for

DEFAULT_LATENCY_S = 50e-6
DEFAULT_SECONDS_PER_BYTE = 1e-9  # 8 Gbit/s, until the link has been measured


def default_ready_times(tensors: Sequence[TensorSpec], spacing_s: float = 1e-4) -> dict[str, float]:
    """A guess before anything is measured: gradients arrive in reverse forward order."""
    ordered = sorted(tensors, key=lambda t: -t.priority)
    return {t.name: i * spacing_s for i, t in enumerate(ordered)}


def paced_ready_times(tensors: Sequence[TensorSpec], latency_s: float = DEFAULT_LATENCY_S,
                      seconds_per_byte: float = DEFAULT_SECONDS_PER_BYTE) -> dict[str, float]:
    """A guess that bounds memory before anything is measured: gradients arrive in reverse forward
    order no faster than the link carries them, so a plan made on it sends each as it comes (what
    a rank holds then is what its budget says, whatever the real pace; priorities reorder
    nothing until the ready times are measured).

    >>> from gradsched.core import TensorSpec
    >>> paced_ready_times([TensorSpec("a", 1000, 0, 0), TensorSpec("b", 250, 1, 1)], 0.0, 1e-6)
    {'b': 0.0, 'a': 0.001}
    """
    ready, at = {}, 0.0
    for spec in sorted(tensors, key=lambda t: -t.priority):
        ready[spec.name] = at
        at += latency_s + spec.nbytes * seconds_per_byte
    return ready


def make_plan(
    tensors: Sequence[TensorSpec],
    ready: Mapping[str, float],
    policy: PolicyConfig,
    latency_s: float = DEFAULT_LATENCY_S,
    seconds_per_byte: float = DEFAULT_SECONDS_PER_BYTE,
    overhead_s: float = 0.0,
    arch: str = "allreduce",
    servers: int = 1,
    hold_bytes: int | None = None,
    gathers: GatherModel | None = None,
) -> Plan:
    """Run ``policy`` on one backward pass with the given ready times (seconds from the first
    ready gradient) over a FIFO link with the given latency, cost per payload byte and
    serial cost per message (see :mod:`gradsched.sim.network`); with ``arch="ps"`` each
    message is a push then a pull to ``servers`` servers, each costing those.

    The engine first runs the policy's warm-up rounds (Prophet profiles them), so the plan
    is what the policy does in steady state. Ties keep the order of ``ready``. ``hold_bytes``:
    no message carries slices of more whole gradients' bytes (the engine's ``hold_bytes``).

    ``gathers`` (``arch="fully_sharded"``): the parameters' all-gathers of the backward pass
    share the link, one schedule with the reduce-scatters (:mod:`gradsched.sim.gathering`): the
    backward pass begins with the queue as a forward pass leaves it, and when a unit's last
    gradient is ready the unit is freed and the gathers that lets go, and the next unit's, are
    on the link before that gradient's reduce-scatter (the runtime's gathers-first rule). The
    ready times are measured, waits for the gathers included: only the link time is modelled.
    """
    missing = [t.name for t in tensors if t.name not in ready]
    if missing:
        raise ValueError(f"no ready time for {len(missing)} tensors, e.g. {missing[:3]}")
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    if gathers is not None:
        unknown = sorted({name for names in gathers.names for name in names} - {t.name for t in tensors})
        if unknown:
            raise ValueError(f"gathers name {len(unknown)} tensors the plan is not over, e.g. {unknown[:3]}")
    policy = policy.for_link(sum(t.nbytes for t in tensors), latency_s, seconds_per_byte, overhead_s)
    engine = Scheduler(tensors, policy.build(), hold_bytes)
    network = network_for(arch, latency_s, seconds_per_byte, overhead_s, servers=servers)
    recorder = _Recorder()
    loop = EventLoop()
    driver = Driver(engine, network, loop, recorder.launched)
    order = sorted(ready, key=ready.__getitem__)
    first = min(ready.values())
    total = sum(t.nbytes for t in tensors)
    period = (max(ready.values()) - first) + total * seconds_per_byte + (latency_s + overhead_s) * (engine.n_leaves + 1) + 1.0

    units: UnitGathers | None = None

    def handle(event: Event) -> None:
        if event.kind == Kind.READY:
            done = None if units is None else units.computed(event.payload, loop.now)
            driver.ready(event.payload)
            if done is not None and done > 0:  # the next unit's backward pass begins: its parameters
                units.need(done - 1, loop.now)
        elif event.kind == Kind.SENT:
            driver.sent(event.payload)
        else:
            driver.complete(event.payload)

    rounds = engine.policy.warmup_iterations + 1
    for round_index in range(rounds):
        origin = max(round_index * period, loop.now)
        recorder.begin(origin, record=round_index == rounds - 1)
        engine.begin_iteration(origin)
        if gathers is not None:
            units = UnitGathers(gathers, network)
            units.backward_begins(origin)
        for name in order:
            loop.schedule(origin + ready[name] - first, Kind.READY, name)
        loop.run(handle)
    span = max((m.finish_s for m in recorder.planned), default=0.0)
    # what the plan reports it was made with: the scalar options (a plan travels to every rank)
    options = tuple(sorted((k, v) for k, v in dataclasses.asdict(policy).items()
                           if v is None or isinstance(v, (bool, int, float, str))))
    plan = Plan(policy.name, engine.policy.cross_barrier, tuple(recorder.planned), span, options)
    plan.check(tensors)
    return plan


class _Recorder:
    """Turns the launches of the recorded round into planned messages with their causes."""

    def __init__(self) -> None:
        self.planned: list[PlannedMessage] = []
        self.origin = 0.0
        self.record = False
        self._index: dict[int, int] = {}  # message id -> index in the plan

    def begin(self, origin: float, record: bool) -> None:
        self.origin, self.record = origin, record

    def launched(self, launched: Launched, cause: Cause) -> None:
        if not self.record:
            return
        message, transfer = launched
        after = None if cause.message is None else self._index.get(cause.message.id)
        self._index[message.id] = len(self.planned)
        slices = tuple((t.tensor.name, t.offset, t.numel) for t in message.tasks)
        self.planned.append(PlannedMessage(slices, message.nbytes, cause.tensor, after,
                                           message.launched_at - self.origin, transfer.complete - self.origin,
                                           after_sent=cause.sent))
