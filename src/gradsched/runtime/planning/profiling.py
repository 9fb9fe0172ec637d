"""Measured timings of real iterations, turned into a model table the simulator can run.

Each profiled round records when the forward pass started and ended, when each module that
owns parameters started its forward pass and how long it first waited for (and applied)
parameter updates, and when each gradient became ready. From the medians over several
rounds, :func:`measured_table` builds a :class:`~gradsched.models.table.ModelTable`: one
layer per such module in forward order, forward time from its start to the next module's
start minus the waiting (the simulator adds waiting itself), backward time from the gap
between its gradients and those of the layer after it (which backward finishes first).
The runtime uses it to predict, with the same simulator as ``gradsched simulate``, whether
its policy beats DDP-style buckets on this model and this link.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gradsched.models.table import Layer, ModelTable, ParamSpec


@dataclass
class RoundTiming:
    forward_start: float = 0.0
    forward_end: float = 0.0
    module_starts: dict[str, float] = field(default_factory=dict)  # first call of each module
    module_waits: dict[str, float] = field(default_factory=dict)  # time it then spent waiting for updates
    ready: dict[str, float] = field(default_factory=dict)  # gradient name -> time it was ready
    events: dict = field(default_factory=dict, repr=False)  # CUDA: stamp -> event (gradsched.runtime.planning.clock)


def measured_table(
    rounds: Sequence[RoundTiming],
    owners: Mapping[str, Sequence[str]],
    params: Mapping[str, tuple[int, int]],
    name: str = "measured",
) -> ModelTable | None:
    """Median timings of ``rounds`` as a model table, or None when they do not describe
    every parameter (a parameter used outside the modules that own it, say).

    ``owners``: module name -> the parameters it owns, ``params``: name -> (numel, bytes each).
    """
    complete = [r for r in rounds if r.forward_end > r.forward_start and r.ready and r.module_starts]
    if not complete:
        return None
    order = sorted(complete[-1].module_starts, key=complete[-1].module_starts.__getitem__)

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    start = {m: median([r.module_starts[m] - r.forward_start for r in complete if m in r.module_starts])
             for m in order}
    wait = {m: median([r.module_waits.get(m, 0.0) for r in complete if m in r.module_starts]) for m in order}
    forward_total = median([r.forward_end - r.forward_start for r in complete])
    ready = {p: median([r.ready[p] - r.forward_end for r in complete if p in r.ready]) for p in params}
    assigned: dict[str, list[str]] = {}
    seen: set[str] = set()
    for module in order:
        mine = [p for p in owners.get(module, ()) if p in params and p not in seen]
        seen.update(mine)
        assigned[module] = mine
    if seen != set(params):
        return None
    layers = []
    starts = [start[m] for m in order] + [forward_total]
    starts[0] = 0.0  # time before the first module counts as its own
    done_after = 0.0  # backward of the layers after this one ended here (relative to forward end)
    backward = {}
    for module in reversed(order):
        finished = max((ready[p] for p in assigned[module]), default=done_after)
        backward[module] = max(0.0, finished - done_after)
        done_after = max(done_after, finished)
    for k, module in enumerate(order):
        specs = tuple(ParamSpec(p, params[p][0], params[p][1]) for p in assigned[module])
        forward = starts[k + 1] - starts[k] - wait[module]
        layers.append(Layer(module, max(0.0, forward), backward[module], specs))
    return ModelTable(name, tuple(layers), {"source": "measured", "rounds": len(complete)})
