import random

import pytest

from gradsched.core import detect_stages
from gradsched.core.stages import ReadyProfile


def stepwise(rng: random.Random, sizes, noise: float):
    """Ready times in bursts: tensors of a stage within ~0.2 ms, stages 3-8 ms apart."""
    times, truth, t = {}, [], 0.0
    for k, size in enumerate(sizes):
        names = []
        for j in range(size):
            t += rng.uniform(0.0, 2e-4)
            name = f"s{k}.{j}"
            times[name] = t * (1 + rng.uniform(-noise, noise))
            names.append(name)
        truth.append(names)
        t += rng.uniform(3e-3, 8e-3)
    return times, truth


@pytest.mark.parametrize("seed", range(10))
def test_recovers_known_stages_from_a_noisy_stepwise_trace(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 12) for _ in range(rng.randint(2, 8))]
    times, truth = stepwise(rng, sizes, noise=0.01)
    plan = detect_stages(times)
    assert [sorted(s.tensors) for s in plan.stages] == [sorted(names) for names in truth]
    for stage, following in zip(plan.stages, plan.stages[1:]):
        assert stage.gap_after == pytest.approx(following.start - stage.end)
        assert stage.gap_after > plan.threshold
    assert plan.stages[-1].gap_after == 0.0
    assert all(plan.stage_of[name] == k for k, names in enumerate(truth) for name in names)


def test_simultaneous_arrivals_form_one_stage_in_given_order():
    plan = detect_stages({"b": 1.0, "a": 1.0, "c": 1.0})
    assert [s.tensors for s in plan.stages] == [("b", "a", "c")]


def test_profile_takes_per_tensor_medians():
    profile = ReadyProfile()
    for origin, late in ((0.0, 5.0), (10.0, 1.0), (20.0, 2.0)):
        profile.begin_iteration(origin)
        profile.record("x", origin + late)
    assert profile.median_times() == {"x": 2.0}


def test_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        detect_stages({})
    with pytest.raises(ValueError, match="factor"):
        detect_stages({"a": 0.0}, factor=0)
