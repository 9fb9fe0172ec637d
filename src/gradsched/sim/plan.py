"""Plans: the order in which every rank launches its messages, made by the scheduler core.

Collectives must be issued in the same order on every rank, so the runtime cannot let each
rank's engine react to its own timing. Instead the engine runs here, on predicted events
(when each gradient becomes ready, and a link estimate), exactly as in the simulator, and
the messages it launches, in launch order, become a :class:`Plan`. Every rank follows the
same plan with its own timing: message k starts once every earlier message has started,
its own gradients are ready, and the event that released it in the plan (a gradient
becoming ready, or an earlier message finishing, which is how a credit window shows up)
has happened locally too. The order is fixed; only the timing is local.

>>> from gradsched.core import TensorSpec, policy_config
>>> tensors = [TensorSpec(f"w{i}", 1000, layer=i, priority=i) for i in range(3)]
>>> ready = {"w2": 0.0, "w1": 0.001, "w0": 0.002}  # each 4 ms on the wire at 1 us/byte
>>> plan = make_plan(tensors, ready, policy_config("priority"), seconds_per_byte=1e-6)
>>> [(m.slices[0][0], m.after_tensor, m.after_message) for m in plan.messages]
[('w2', 'w2', None), ('w0', None, 0), ('w1', None, 1)]
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..core import Scheduler
from ..core.base import PolicyConfig
from ..core.task import Message, TensorSpec
from .network import Network, PushPull

DEFAULT_LATENCY_S = 50e-6
DEFAULT_SECONDS_PER_BYTE = 1e-9  # 8 Gbit/s, until the link has been measured


@dataclass(frozen=True)
class PlannedMessage:
    slices: tuple[tuple[str, int, int], ...]  # (tensor, first element, number of elements)
    nbytes: int
    after_tensor: str | None  # in the plan, launched when this gradient became ready
    after_message: int | None  # ... or when this earlier message (index) finished
    launch_s: float  # predicted launch, seconds after the first gradient was ready
    finish_s: float  # predicted completion


@dataclass(frozen=True)
class Plan:
    policy: str
    cross_barrier: bool  # next forward of a layer waits only for that layer's update
    messages: tuple[PlannedMessage, ...]
    span_s: float  # predicted time from the first ready gradient to the last completion

    def check(self, tensors: Sequence[TensorSpec]) -> None:
        """Raise ValueError unless the slices cover every tensor exactly once."""
        covered: dict[str, list[tuple[int, int]]] = {t.name: [] for t in tensors}
        for message in self.messages:
            for name, offset, numel in message.slices:
                if name not in covered:
                    raise ValueError(f"plan names unknown tensor {name!r}")
                covered[name].append((offset, numel))
        for spec in tensors:
            position = 0
            for offset, numel in sorted(covered[spec.name]):
                if offset != position:
                    raise ValueError(f"plan covers {spec.name!r} with a gap or overlap at element {position}")
                position += numel
            if position != spec.numel:
                raise ValueError(f"plan covers {position} of {spec.numel} elements of {spec.name!r}")


def default_ready_times(tensors: Sequence[TensorSpec], spacing_s: float = 1e-4) -> dict[str, float]:
    """A guess before anything is measured: gradients arrive in reverse forward order."""
    ordered = sorted(tensors, key=lambda t: -t.priority)
    return {t.name: i * spacing_s for i, t in enumerate(ordered)}


def make_plan(
    tensors: Sequence[TensorSpec],
    ready: Mapping[str, float],
    policy: PolicyConfig,
    latency_s: float = DEFAULT_LATENCY_S,
    seconds_per_byte: float = DEFAULT_SECONDS_PER_BYTE,
    overhead_s: float = 0.0,
    arch: str = "allreduce",
) -> Plan:
    """Run ``policy`` on one backward pass with the given ready times (seconds from the first
    ready gradient) over a FIFO link with the given latency, cost per payload byte and
    serial cost per message (see :mod:`gradsched.sim.network`); with ``arch="ps"`` each
    message is a push then a pull, each costing those.

    The engine first runs the policy's warm-up rounds (Prophet profiles them), so the plan
    is what the policy does in steady state. Ties keep the order of ``ready``.
    """
    missing = [t.name for t in tensors if t.name not in ready]
    if missing:
        raise ValueError(f"no ready time for {len(missing)} tensors, e.g. {missing[:3]}")
    engine = Scheduler(tensors, policy.build())
    if arch not in ("allreduce", "ps"):
        raise ValueError(f"arch must be 'allreduce' or 'ps', got {arch!r}")
    network = (PushPull if arch == "ps" else Network)(latency_s, seconds_per_byte, overhead_s)
    order = sorted(ready, key=ready.__getitem__)
    first = min(ready.values())
    total = sum(t.nbytes for t in tensors)
    period = (max(ready.values()) - first) + total * seconds_per_byte + (latency_s + overhead_s) * (engine.n_leaves + 1) + 1.0
    rounds = engine.policy.warmup_iterations + 1
    planned: list[PlannedMessage] = []
    for round_index in range(rounds):
        last = round_index == rounds - 1
        origin = round_index * period
        heap: list[tuple] = []
        seq = 0
        for name in order:
            seq += 1
            heapq.heappush(heap, (origin + ready[name] - first, 1, seq, name))
        engine.begin_iteration(origin)
        index_of: dict[int, int] = {}  # message id -> index in the plan
        finish_of: dict[int, float] = {}

        def launch(messages: list[Message], now: float, after_tensor: str | None, after_message: int | None) -> None:
            nonlocal seq
            for message in messages:
                transfer = network.submit(message.nbytes, now)
                seq += 1
                heapq.heappush(heap, (transfer.complete, 0, seq, message))
                finish_of[message.id] = transfer.complete
                if last:
                    index_of[message.id] = len(planned)
                    slices = tuple((t.tensor.name, t.offset, t.numel) for t in message.tasks)
                    planned.append(
                        PlannedMessage(slices, message.nbytes, after_tensor, after_message,
                                       now - origin, transfer.complete - origin)
                    )

        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            if kind == 1:
                launch(engine.on_ready(payload, now).start, now, payload, None)
            else:
                decision = engine.on_finished(payload, now)
                launch(decision.start, now, None, index_of.get(payload.id))
    span = max((m.finish_s for m in planned), default=0.0)
    plan = Plan(policy.name, engine.policy.cross_barrier, tuple(planned), span)
    plan.check(tensors)
    return plan
