"""Lower bounds on the time of one iteration, for any schedule.

The plain bound, ``max(compute, communication)``, says only that neither the device nor the
link can do more than all of its work in one iteration. It ignores *when* gradients exist
and *when* the next forward pass needs them. The dependency bound adds that: layer ``j``'s
gradients exist only once backward has passed layer ``j``, and the next forward reaches
layer ``j`` only after every layer before it has been updated. So, with ``T`` the period of
an iteration (measured from the start of one forward pass to the next), for every layer
``j``, the gradients of layers ``0..j`` (ready no earlier than layer ``j``'s, since backward
runs in reverse) must all cross the link between ``ready(j)`` and ``T + start(j)``:

    T >= ready(j) + comm(bytes of layers 0..j) - start(j)

where ``start(j)`` is when forward reaches layer ``j`` and ``ready(j)`` when backward has
produced its gradients, both from the start of forward. No preemption, partitioning or
ordering escapes it: the bytes are not there earlier and are needed by then. Where the most
urgent gradient is also the last one ready (a Transformer's embedding shared with its output
projection belongs to the first layer and gets its last contribution at the very end of
backward), this bound is ``compute + comm(that tensor)``, well above the plain one.

Update time and per-message costs are left out, so both stay lower bounds.
"""

from __future__ import annotations

from typing import Callable

from ..models.table import ModelTable


def raises_bound(dependency_s: float | None, plain_s: float) -> bool:
    """Whether the dependency bound is worth showing next to the plain one (> 0.5% above)."""
    return bool(dependency_s) and dependency_s > 1.005 * plain_s


def bound(compute_s: float, comm_s: float) -> float:
    """No schedule beats max(T_compute, T_comm) per iteration."""
    return max(compute_s, comm_s)


def dependency_bound(model: ModelTable, comm_time: Callable[[float], float], compute_scale: float = 1.0) -> float:
    """The plain bound, raised by the order in which gradients exist and are needed.

    ``comm_time(nbytes)``: seconds to move ``nbytes`` of gradients once at link speed;
    ``compute_scale`` multiplies every compute time of the table (a measured compute time
    over the profile's)."""
    layers = model.layers
    starts, t = [], 0.0
    for layer in layers:
        starts.append(t)
        t += layer.forward_s * compute_scale
    ready = [0.0] * len(layers)
    for j in reversed(range(len(layers))):
        t += layers[j].backward_s * compute_scale
        ready[j] = t
    compute = t
    best = bound(compute, comm_time(model.gradient_bytes))
    prefix_bytes = 0
    for j, layer in enumerate(layers):
        prefix_bytes += sum(p.nbytes for p in layer.params)
        if layer.params:
            best = max(best, ready[j] + comm_time(prefix_bytes) - starts[j])
    return best
