"""The architectures a user can name, in the one list the runtime, the simulator, the bench and
the CLI share, each with what the others need to know of it (nothing here runs one: the
runtime's factory, :mod:`gradsched.runtime.architectures.choice`, builds its object).

>>> NAMES
('allreduce', 'ps', 'sharded', 'fully_sharded')
>>> kind("ps").servers, kind("fully_sharded").phases
(True, True)
>>> kind("ring")
Traceback (most recent call last):
...
ValueError: architecture must be 'allreduce', 'ps', 'sharded' or 'fully_sharded', got 'ring'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str  # as users name it: architecture=..., --arch
    summary: str  # one line, for help texts
    servers: bool = False  # the last ranks serve: workers push gradients to them and pull the averages
    phases: bool = False  # a message is one phase of an all-reduce (a reduce-scatter, or the all-gather after)
    gathers: bool = False  # the parameters are whole only around their use, gathered in the forward pass


KINDS: tuple[Kind, ...] = (
    Kind("allreduce", "all-reduce among the workers"),
    Kind("ps", "parameter servers: the last ranks average what the workers push", servers=True),
    Kind("sharded", "each rank owns 1/n of every parameter and its optimizer state: reduce-scatter in "
                    "backward, all-gather after the step", phases=True),
    Kind("fully_sharded", "sharded, and each module's parameters whole only around its forward and backward "
                          "passes", phases=True, gathers=True),
)
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)


def kind(name: str) -> Kind:
    """The architecture ``name`` names (a ``ValueError`` lists the names)."""
    for k in KINDS:
        if k.name == name:
            return k
    raise ValueError(f"architecture must be {', '.join(map(repr, NAMES[:-1]))} or {NAMES[-1]!r}, got {name!r}")
