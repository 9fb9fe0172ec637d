"""Uneven inputs (uneven.py): worker rank r trains 4 + 3r steps of a small CNN with BatchNorm.

Inside ``join()`` every policy ends with the parameters and buffers of PyTorch's DDP +
``join()`` on every rank (gradient accumulation with no_sync, divide_by_initial_world_size
both ways, find_unused_parameters, parameter servers, PyTorch's generic ``Join``), while plans
change every few backward passes. Without it, the ranks still training fail within the
timeout with an error naming the rank that stopped and uneven inputs.

Tolerance: 1e-6 absolute (parameters move by about 1e-2 in these runs).
"""

from __future__ import annotations

import json

import pytest
import torch

from workers.launch import run_ranks

TOLERANCE = 1e-6
SLOW = pytest.mark.slow


def train(tmp_path, name: str, world: int, *args: str, ok: bool = True, agent_store: bool = False) -> list[dict]:
    """Run uneven.py; return each worker's report, with its final state under "state"."""
    out = tmp_path / name
    results = run_ranks("uneven", world, str(out), *args, timeout=150, agent_store=agent_store)
    reports = []
    for rank, result in enumerate(results):
        path = tmp_path / f"{name}.rank{rank}.json"
        if not path.exists():  # a parameter server: no report
            assert result.returncode == 0, result.stderr[-3000:]
            continue
        report = json.loads(path.read_text())
        if ok:
            assert result.returncode == 0 and report["error"] is None, result.stderr[-3000:]
            report["state"] = torch.load(tmp_path / f"{name}.rank{rank}.pt")
        reports.append(report)
    return reports


def difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().nan_to_num(float("inf")).max().item() for k in a)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """PyTorch's DDP + join(), the reference of every setting below."""
    tmp = tmp_path_factory.mktemp("ddp")
    runs = {"plain": (2,), "accumulate-by-active": (3, "--accumulate", "2", "--divide-by-active"),
            "unused": (3, "--find-unused")}
    reference = {}
    for name, (world, *args) in runs.items():
        reports = train(tmp, name, world, "--impl", "ddp", *args)
        assert [r["steps"] for r in reports] == [4 + 3 * r for r in range(world)]
        for report in reports[1:]:
            assert difference(report["state"], reports[0]["state"]) == 0.0  # DDP's join ends equal
        reference[name] = reports[0]["state"]
    even = train(tmp, "even", 3, "--impl", "ddp", "--accumulate", "2", "--extra", "0")[0]["state"]
    by_initial = train(tmp, "by-initial", 3, "--impl", "ddp", "--accumulate", "2")[0]["state"]
    # the settings differ from each other: a wrong divisor or a lost step cannot pass
    assert difference(reference["accumulate-by-active"], by_initial) > 1e-3
    assert difference(reference["accumulate-by-active"], even) > 1e-3
    return reference


def assert_equal_to(reports: list[dict], reference: dict) -> None:
    for rank, report in enumerate(reports):
        assert difference(report["state"], reference) <= TOLERANCE, f"rank {rank}"


@pytest.mark.parametrize("policy", ["fifo", pytest.param("priority", marks=SLOW),
                                    pytest.param("bytescheduler", marks=SLOW), "prophet"])
def test_model_join_equals_ddp_join(tmp_path, ddp, policy):
    reports = train(tmp_path, policy, 2, "--impl", "gradsched", "--policy", policy)
    assert [r["steps"] for r in reports] == [4, 7]
    assert_equal_to(reports, ddp["plain"])


@pytest.mark.parametrize("policy", ["bytescheduler", pytest.param("prophet", marks=SLOW)])
def test_generic_join_of_the_wrapped_optimizer_with_accumulation_averages_over_ranks_training(
        tmp_path, ddp, policy):
    """``Join([optimizer])`` (gradsched.wrap), no_sync accumulation, divide_by_initial_world_size=False."""
    reports = train(tmp_path, policy, 3, "--impl", "wrap", "--generic", "--accumulate", "2",
                    "--divide-by-active", "--policy", policy)
    assert_equal_to(reports, ddp["accumulate-by-active"])


def test_join_with_unused_parameters(tmp_path, ddp):
    """A layer some ranks skip: while ranks have joined, one every rank still training skipped
    gets a zero gradient, as with DDP + join()."""
    reports = train(tmp_path, "unused", 3, "--impl", "gradsched", "--find-unused", "--policy", "prophet")
    assert_equal_to(reports, ddp["unused"])


def test_join_with_parameter_servers(tmp_path, ddp):
    """2 workers and 1 server: a joined worker pushes zeros and pulls, round after round."""
    reports = train(tmp_path, "ps", 3, "--impl", "wrap", "--servers", "1", "--policy", "prophet")
    assert len(reports) == 2
    assert_equal_to(reports, ddp["plain"])


def test_throw_on_early_termination(tmp_path):
    reports = train(tmp_path, "throw", 2, "--impl", "gradsched", "--throw", ok=False)
    assert reports[0]["error"] == "RuntimeError: Rank 0 exhausted all inputs."
    assert "Detected at least one rank that exhausted inputs" in reports[1]["error"]


def test_an_iteration_the_joined_ranks_cannot_shadow_is_refused(tmp_path):
    reports = train(tmp_path, "eval", 2, "--impl", "gradsched", "--misuse", "eval", "--timeout", "10", ok=False)
    expected = "a forward pass with gradients enabled ran no backward pass"
    assert reports[1]["error"].startswith("GradschedError: gradsched join: " + expected), reports[1]
    assert reports[0]["error"] is not None  # rank 0 was shadowing: it cannot finish either


@pytest.mark.parametrize("impl", ["gradsched", "wrap"])
def test_iterations_without_a_step_inside_join_are_as_with_ddp(tmp_path, impl):
    """The last rank skips step() once the other has joined (the gradients zeroed unused): DDP
    allows it, and control points still come at the same point on every rank."""
    reference = train(tmp_path, "ddp-nostep", 2, "--impl", "ddp", "--misuse", "nostep")[0]["state"]
    assert_equal_to(train(tmp_path, f"{impl}-nostep", 2, "--impl", impl, "--misuse", "nostep"), reference)


@pytest.mark.parametrize("then,seen", [
    ("exit", "rank 0 closed gradsched after 4 backward passes"),  # the short rank's script ended
    pytest.param("barrier", "rank 0 is at backward pass 4, its latest forward pass began",  # it waits elsewhere
                 marks=pytest.mark.slow),
])
def test_without_join_the_ranks_still_training_name_uneven_inputs(tmp_path, then, seen):
    # the store is hosted apart from the ranks, as under torchrun: it outlives rank 0's ended script
    reports = train(tmp_path, then, 3, "--impl", "wrap", "--no-join", "--then", then, "--timeout", "5", ok=False,
                    agent_store=True)
    assert reports[0]["error"] is None
    for rank in (1, 2):
        error = reports[rank]["error"]
        assert error.startswith("GradschedError: ") and f"this rank ({rank}) is in backward pass 5" in error, error
        assert seen in error and "Rank 0 stopped after fewer backward passes than this rank" in error, error
        assert "with optimizer.join():" in error
