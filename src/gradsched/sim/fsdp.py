"""What FSDP2 (``fully_shard`` per layer) would do on the simulated cluster: no scheduling,
one layer's all-gather prefetched ahead.

Every layer with parameters is its own unit, sharded over the workers. On each worker's one
FIFO link (each collective (n-1)/n of its bytes, as ``Cluster(arch="sharded")`` charges):

* forward: layer i's parameters are all-gathered before its forward; the all-gather of
  layer i+1 is issued when layer i's forward starts (one ahead); the first after the step;
* backward (``reshard_after_forward=True``, FSDP2's default): each layer's parameters are
  all-gathered again before its backward, layer i-1's issued when layer i's backward
  starts; with ``False`` (ZeRO-2-like) they stay from the forward pass;
* each layer's gradients are reduce-scattered once its backward ends, in that order;
* the step (no time) waits for the last reduce-scatter; the next forward follows.

Compare with ``simulate(model, Cluster(arch="sharded"), policy)``: the same bytes each
phase, scheduled by the policy in backward and gathered as soon as the step is done; and
with :func:`fully_sharded_iteration_s`, gradsched's own ``architecture="fully_sharded"``,
whose gathers follow the runtime's rules (:class:`gradsched.core.gathers.GatherQueue`:
prefetched within a byte budget, a need forcing what is queued before it, the last layers
kept from forward to backward as the budget allows), each layer's gradients reduce-scattered
once its backward ends (``fifo``'s order) behind the gathers due then, all on the one FIFO link.

>>> from gradsched.models.table import Layer, ModelTable, ParamSpec
>>> model = ModelTable("three", tuple(Layer(f"l{i}", 1.0, 1.0, (ParamSpec(f"w{i}", 750),)) for i in range(3)))
>>> cluster = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0, arch="sharded")  # 1.5 s per phase
>>> fsdp_iteration_s(model, cluster, reshard_after_forward=False)
11.0
>>> fsdp_iteration_s(model, cluster, reshard_after_forward=True)
14.5
>>> fully_sharded_iteration_s(model, cluster, budget_bytes=2 * 3000)  # (3000 bytes a layer) keeps the last one
13.0
>>> fully_sharded_iteration_s(model, cluster)  # one layer whole at a time: each gather behind the one before
17.5
>>> fully_sharded_iteration_s(model, cluster, gathers_first=False)  # ... and behind a reduce-scatter in backward
19.5
>>> fully_sharded_iteration_s(model, cluster, budget_bytes=4 * 3000)  # all kept: gathered once an iteration
11.0
"""

from __future__ import annotations

from dataclasses import replace

from ..core import policy_config
from ..core.base import PolicyConfig
from ..core.policies import FifoConfig
from ..models.table import ModelTable
from .cluster import Cluster
from .network import Network
from .simulator import simulate


def fsdp_iteration_s(model: ModelTable, cluster: Cluster, reshard_after_forward: bool = True,
                     iterations: int = 6) -> float:
    """Steady-state seconds per iteration (between the last two forward starts)."""
    if cluster.bursts is not None:
        raise ValueError("FSDP2's schedule is simulated on a steady link: give the link averaged over the clock")
    if not cluster.kind.phases:
        raise ValueError(f"FSDP shards the parameters: give a Cluster(arch='sharded'), got {cluster.arch!r}")
    link = Network(cluster.latency_s, cluster.phase_seconds_per_byte, cluster.overhead_s)
    layers = model.layers
    nbytes = [sum(p.nbytes for p in layer.params) for layer in layers]
    starts, step = [], 0.0
    for _ in range(iterations):
        t, issued = step, [None] * len(layers)  # forward
        issued[0] = link.submit(nbytes[0], step).complete if nbytes[0] else step
        for i, layer in enumerate(layers):
            start = max(t, issued[i])
            if i == 0:
                starts.append(start)
            if i + 1 < len(layers):  # one ahead, issued as this layer starts
                issued[i + 1] = link.submit(nbytes[i + 1], start).complete if nbytes[i + 1] else start
            t = start + layer.forward_s
        gathered = [t] * len(layers)  # backward
        last = len(layers) - 1
        if reshard_after_forward and nbytes[last]:
            gathered[last] = link.submit(nbytes[last], t).complete
        done = t
        for i in range(last, -1, -1):
            start = max(t, gathered[i])
            if reshard_after_forward and i > 0 and nbytes[i - 1]:
                gathered[i - 1] = link.submit(nbytes[i - 1], start).complete
            t = start + layers[i].backward_s
            if nbytes[i]:
                done = max(done, link.submit(nbytes[i], t).complete)
        step = max(t, done)
    return starts[-1] - starts[-2]


def fully_sharded_iteration_s(model: ModelTable, cluster: Cluster, budget_bytes: int | None = None,
                              iterations: int = 6, gathers_first: bool = True,
                              policy: PolicyConfig | str | None = None) -> float:
    """Steady-state seconds per iteration of ``architecture="fully_sharded"`` under ``policy``
    (None: each layer's gradients reduce-scattered once its backward pass ends, in that order;
    ``budget_bytes``: ``gather_budget_mb`` in bytes, None: the runtime's default, the largest
    layer's): :func:`gradsched.sim.simulate` on ``Cluster(arch="fully_sharded")``, where the
    gathers and the policy's reduce-scatters share the link (see :mod:`gradsched.sim.gathering`);
    with ``gathers_first`` (the runtime's rule) a layer's reduce-scatter waits behind the gathers
    due when its backward pass ends, else it goes first. No gradient budget holds the backward
    pass (``gradient_budget_mb=inf``)."""
    if not cluster.kind.phases:
        raise ValueError(f"fully sharded shards the parameters: give a Cluster(arch='sharded') or "
                         f"Cluster(arch='fully_sharded'), got {cluster.arch!r}")
    config = PER_LAYER if policy is None else policy_config(policy) if isinstance(policy, str) else policy
    rounds = config.build().warmup_iterations + iterations
    return simulate(model, replace(cluster, arch="fully_sharded"), config, iterations=rounds, record=False,
                    gather_budget_bytes=budget_bytes, gathers_first=gathers_first, hold_bytes=None).iteration_s


#: one message per gradient, launched once it is ready (one per layer where a layer has one tensor)
PER_LAYER = FifoConfig(bucket_cap_bytes=1, first_bucket_bytes=1)
