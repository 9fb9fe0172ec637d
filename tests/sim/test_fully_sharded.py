"""The simulator's fully sharded model (gradsched.sim.fsdp.fully_sharded_iteration_s): the
runtime's gather queue on the one link, against FSDP2's model and against hand-computed
schedules (the module's doctest: three layers, 13.0 s with the last layer kept, 11.0 s with
all kept, as FSDP2 without resharding)."""

from __future__ import annotations

import pytest

from gradsched.models.table import Layer, ModelTable, ParamSpec
from gradsched.sim.cluster import Cluster
from gradsched.sim.fsdp import fsdp_iteration_s, fully_sharded_iteration_s


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
