"""The lower bounds of gradsched.sim.bounds, by hand and against the simulator."""

from __future__ import annotations

import pytest

from gradsched.models import model_table as get_model
from gradsched.models.table import Layer, ModelTable, ParamSpec
from gradsched.sim import Cluster, bound, dependency_bound, simulate


def per_byte(seconds: float):
    return lambda nbytes: nbytes * seconds


def test_two_layers_by_hand():
    # forward 1 + 1, backward 2 + 2: layer 1's 100 bytes ready at 4, layer 0's at 6.
    # Layer 0: ready 6, its 100 bytes take 1, needed at T + 0 -> T >= 7.
    # Layer 1: ready 4, layers 0..1 (200 bytes) take 2, needed at T + 1 -> T >= 5.
    # Plain: max(compute 6, communication 2) = 6.
    model = ModelTable("two", (Layer("a", 1.0, 2.0, (ParamSpec("a.w", 25),)),
                               Layer("b", 1.0, 2.0, (ParamSpec("b.w", 25),))))
    assert bound(6.0, 2.0) == 6.0
    assert dependency_bound(model, per_byte(0.01)) == pytest.approx(7.0)
    assert dependency_bound(model, per_byte(0.01), compute_scale=2.0) == pytest.approx(13.0)  # 12 + 1


def test_the_last_layer_bounds_a_link_bound_model():
    # The last layer's gradients exist only after its backward, and everything must be back
    # when forward reaches it: T >= start + forward + backward of it + all bytes - start.
    model = ModelTable("two", (Layer("a", 1.0, 2.0, (ParamSpec("a.w", 25),)),
                               Layer("b", 1.0, 3.0, (ParamSpec("b.w", 2500),))))
    # comm(all 10100 bytes) = 101; layer b: ready 5, start 1 -> 105; layer a: ready 7 + 1 = 8
    assert dependency_bound(model, per_byte(0.01)) == pytest.approx(105.0)


def test_layers_without_parameters_only_add_time():
    model = ModelTable("gap", (Layer("a", 1.0, 2.0, (ParamSpec("a.w", 25),)), Layer("relu", 0.5, 0.5)))
    assert dependency_bound(model, per_byte(0.01)) == pytest.approx(4.0 + 1.0)


def test_a_shared_embedding_costs_its_own_communication_after_compute():
    """The Transformer's shared embedding is the most urgent gradient and the last ready:
    no schedule beats compute + its communication, well above max(compute, communication)."""
    model = get_model("transformer")
    cluster = Cluster(2, 5e9)
    embedding = sum(p.nbytes for p in model.layers[0].params)
    assert embedding > 0.25 * model.gradient_bytes
    tight = dependency_bound(model, cluster.comm_time)
    assert tight >= model.compute_s + cluster.comm_time(embedding) - 1e-12
    assert tight > 1.05 * bound(model.compute_s, cluster.comm_time(model.gradient_bytes))


@pytest.mark.parametrize("name", ["transformer", "resnet50", "vgg16"])
@pytest.mark.parametrize("gbps", [1, 5, 25])
def test_no_policy_beats_the_dependency_bound(name, gbps):
    model = get_model(name)
    for arch, servers in (("allreduce", 0), ("ps", 2)):
        cluster = Cluster(4, gbps * 1e9, arch=arch, servers=servers)
        for policy in ("fifo", "bytescheduler", "prophet"):
            r = simulate(model, cluster, policy, iterations=8, record=False)
            assert r.iteration_s >= r.dependency_bound_s * (1 - 1e-9), (policy, arch)
