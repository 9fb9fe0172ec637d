"""The simulator's fully sharded model (gradsched.sim.fsdp.fully_sharded_iteration_s): the
runtime's gather queue on the one link, against FSDP2's model and against hand-computed
schedules (the module's doctest: three layers, 13.0 s with the last layer kept, 11.0 s with
all kept, as FSDP2 without resharding)."""

from __future__ import annotations

import pytest

from gradsched.models.table import Layer, ModelTable, ParamSpec
from gradsched.sim.cluster import Cluster
from gradsched.core import TensorSpec, policy_config
from gradsched.sim import make_plan, simulate
from gradsched.core.gathers import GatherModel
from gradsched.sim.fsdp import PER_LAYER, fsdp_iteration_s, fully_sharded_iteration_s


def uneven() -> ModelTable:
    return ModelTable("uneven", tuple(Layer(f"l{i}", 0.2 * (i + 1), 0.4, (ParamSpec(f"w{i}", 250 * (4 - i)),))
                                      for i in range(4)))


CLUSTER = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0, arch="sharded")


def test_a_budget_above_the_model_and_one_more_layer_gathers_once_as_fsdp2_without_resharding():
    model = uneven()
    total = sum(p.nbytes for layer in model.layers for p in layer.params)
    largest = max(p.nbytes for layer in model.layers for p in layer.params)
    assert fully_sharded_iteration_s(model, CLUSTER, budget_bytes=total + largest) == pytest.approx(
        fsdp_iteration_s(model, CLUSTER, reshard_after_forward=False))


def test_more_budget_is_never_slower_and_at_fsdp2s_memory_not_slower_than_fsdp2():
    """FSDP2's model has streams: one unit whole in use and the next prefetched, two of the
    largest units at most; at that budget gradsched's schedule is not slower. The default (one
    unit: FSDP2's memory on a host, where it has no streams to prefetch on) is the slowest."""
    model = uneven()
    largest = max(p.nbytes for layer in model.layers for p in layer.params)
    times = [fully_sharded_iteration_s(model, CLUSTER, budget_bytes=k * largest) for k in (1, 2, 3, 4, 8)]
    assert all(a >= b - 1e-9 for a, b in zip(times, times[1:])), times
    assert fully_sharded_iteration_s(model, CLUSTER) == times[0]
    assert times[1] <= fsdp_iteration_s(model, CLUSTER) + 1e-9


def test_it_models_sharded_links_only():
    with pytest.raises(ValueError, match="Cluster.arch='sharded'"):
        fully_sharded_iteration_s(uneven(), Cluster(workers=2, bandwidth_bps=8000.0, arch="allreduce"))


def three() -> ModelTable:
    return ModelTable("three", tuple(Layer(f"l{i}", 1.0, 1.0, (ParamSpec(f"w{i}", 750),)) for i in range(3)))


@pytest.mark.parametrize("policy", ["fifo", "bytescheduler", "prophet"])
def test_the_policys_reduce_scatters_share_the_link_with_the_gathers_and_go_after_those_due(policy):
    """One schedule on one link: every gather the queue lets go when a layer's gradients are
    computed is on the wire before the policy's reduce-scatter launched at that instant; each
    steady iteration gathers every layer twice (the default budget keeps none) and reduce-scatters
    every gradient once, never two transfers at once."""
    model = uneven()
    cluster = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0, arch="fully_sharded")
    for gathers_first in (True, False):
        result = simulate(model, cluster, policy, iterations=8, gathers_first=gathers_first)
        gathers = [m for m in result.messages if m.id == -1]
        reductions = [m for m in result.messages if m.id != -1]
        behind = [(g, r) for g in gathers for r in reductions
                  if g.launched == r.launched and g.segments[0].start > r.segments[0].start]
        assert bool(behind) != gathers_first, (gathers_first, behind[:2])
    total = sum(p.nbytes for layer in model.layers for p in layer.params)
    steady = [m for m in result.messages if m.iteration == 5]
    assert sum(m.nbytes for m in steady if m.id == -1) == 2 * total
    assert sum(m.nbytes for m in steady if m.id != -1) == total
    wire = sorted((seg for m in result.messages for seg in m.segments), key=lambda seg: (seg.start, seg.end))
    assert all(a.end <= b.start + 1e-9 for a, b in zip(wire, wire[1:]))


def test_a_gradient_budget_holds_the_backward_pass_until_a_reduce_scatter_ends():
    """Hand-computed: three layers of 3000 bytes, 1 s forward and backward each, 1.5 s per phase
    on the link, one message per layer. The first backward pass starts at 3 s: l2's gradients
    at 4 s go at once (4-5.5 s), l1's at 5 s wait for the link (5.5-7 s); with a budget of one
    gradient the 6000 bytes not yet reduced hold the pass until l2's reduce-scatter ends at
    5.5 s, so l0's backward runs 5.5-6.5 s instead of 5-6 s."""
    cluster = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0, arch="sharded")
    starts = {}
    for hold in (None, 3000):
        result = simulate(three(), cluster, PER_LAYER, iterations=3, hold_bytes=hold)
        starts[hold] = next(c.start for c in result.compute if c.iteration == 0 and c.phase == "backward"
                            and c.layer == "l0")
    assert starts == {None: 5.0, 3000: 5.5}


def test_the_default_gradient_budget_is_the_runtimes():
    model = uneven()
    cluster = Cluster(workers=2, bandwidth_bps=8000.0, latency_s=0.0, arch="sharded")
    largest = max(p.nbytes for layer in model.layers for p in layer.params)
    assert simulate(model, cluster, "fifo", iterations=6).iteration_s == pytest.approx(
        simulate(model, cluster, "fifo", iterations=6, hold_bytes=2 * largest).iteration_s)
    assert simulate(model, cluster, "fifo", iterations=6).iteration_s != pytest.approx(
        simulate(model, cluster, "fifo", iterations=6, hold_bytes=None).iteration_s)


def test_a_plan_made_beside_the_gathers_puts_the_reduce_scatters_after_them():
    """Hand-computed (1 ms a message, one unit whole at a time): without gathers ``priority``
    sends w2, w1, w0 as each is ready (finished at 1, 2, 3 ms). Fully sharded, w2's unit is freed
    when its gradient is ready and w1's gather goes first (0-1 ms), w2's reduce-scatter after it
    (1-2 ms); w1's gradient frees its unit at 1 ms and w0's gather takes the link from 2 to 3 ms,
    so w1 goes at 3 ms once w2's has finished and w0 after it: finished at 2, 4 and 5 ms, each
    released by the message before it, which is what every rank then follows."""
    tensors = [TensorSpec(f"w{i}", 250, layer=i, priority=i) for i in range(3)]
    ready = {"w2": 0.0, "w1": 0.001, "w0": 0.002}
    units = GatherModel((("w0",), ("w1",), ("w2",)), (1000, 1000, 1000), budget=1000)
    plans = {g is not None: make_plan(tensors, ready, policy_config("priority"), latency_s=0.0, seconds_per_byte=1e-6,
                                      arch="fully_sharded", gathers=g) for g in (None, units)}
    finished = {k: [round(m.finish_s * 1e3, 6) for m in plan.messages] for k, plan in plans.items()}
    assert finished == {False: [1.0, 2.0, 3.0], True: [2.0, 4.0, 5.0]}
    assert [(m.after_tensor, m.after_message) for m in plans[True].messages] == [("w2", None), (None, 0), (None, 1)]
    assert not plans[True].same_schedule(plans[False])
    with pytest.raises(ValueError, match="gathers name 1 tensors the plan is not over"):
        make_plan(tensors, ready, policy_config("priority"), gathers=GatherModel((("x",),), (4,), 4))
