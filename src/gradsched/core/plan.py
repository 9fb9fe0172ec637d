"""Plans: the order in which every rank launches its messages.

Collectives must be issued in the same order on every rank, so a rank cannot let its own
engine react to its own timing. Instead one engine runs on *predicted* events (when each
gradient becomes ready, and a link estimate) and the messages it launches, in launch
order, become a :class:`Plan` (:func:`gradsched.sim.plans.make_plan` makes them). Every
rank then follows the same plan with its own timing: message k starts once every earlier
message has started, its own gradients are ready, and the event that released it in the
plan (a gradient becoming ready, an earlier message finishing, which is how a credit
window shows up, or only being sent, for a window over pushes) has happened locally too.
The order is fixed; only the timing is local.

A plan is also what rank 0 sends to parameter servers, so it holds plain data only.

>>> plan = Plan("priority", True, (
...     PlannedMessage((("w1", 0, 10),), 40, "w1", None, 0.0, 1.0),
...     PlannedMessage((("w0", 0, 10),), 40, None, 0, 1.0, 2.0)), span_s=2.0)
>>> plan.check([TensorSpec("w0", 10, 0, 0), TensorSpec("w1", 10, 1, 1)])
>>> plan.check([TensorSpec("w0", 20, 0, 0), TensorSpec("w1", 10, 1, 1)])
Traceback (most recent call last):
...
ValueError: plan covers 10 of 20 elements of 'w0'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from .task import TensorSpec


#: Parameter servers sum and answer each worker's chunk of a message in pieces of about this
#: many bytes (:mod:`gradsched.runtime.architectures.servers.pushpull`): the pull of a large message starts once its
#: first pieces are in, and the simulator's push-then-pull network models that.
PS_PIECE_BYTES = 1 << 20

#: a policy option's value as a plan records it (every policy's options are plain scalars)
Option = Union[int, float, bool, str, None]


@dataclass(frozen=True)
class PlannedMessage:
    slices: tuple[tuple[str, int, int], ...]  # (tensor, first element, number of elements)
    nbytes: int
    after_tensor: str | None  # in the plan, launched when this gradient became ready
    after_message: int | None  # ... or when this earlier message (index) finished
    launch_s: float  # predicted launch, seconds after the first gradient was ready
    finish_s: float  # predicted completion
    after_sent: bool = False  # after_message released it when sent (its push done), not finished

    @property
    def tensors(self) -> list[str]:
        """Names of the tensors this message carries (a slice of each), in order."""
        return [name for name, _, _ in self.slices]


@dataclass(frozen=True)
class Plan:
    policy: str
    cross_barrier: bool  # next forward of a layer waits only for that layer's update
    messages: tuple[PlannedMessage, ...]
    span_s: float  # predicted time from the first ready gradient to the last completion
    options: tuple[tuple[str, Option], ...] = ()  # the policy's options it was made with, sorted by name
    #   (the sizes it derived from the link included); reported, never followed

    def same_schedule(self, other: Plan) -> bool:
        """Whether following ``other`` launches exactly what this plan launches."""
        return self.messages == other.messages and self.cross_barrier == other.cross_barrier

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
