"""PyTorch's own DDP tests (the selection of selection.py, from the installed torch) against
``gradsched.DistributedDataParallel``, gloo, 2 ranks: each must pass.

A representative part of the selection (:data:`selection.CI`) runs under the default policy on
every test run; the whole selection under every policy, PyTorch's own DDP on the same copy (the
reference: it must pass them all too) and the no-reduction mutant (tests/mutant: exactly the
tests of :data:`selection.PASS_WITHOUT_REDUCTION` may pass on it) are marked slow.
``run.py --policy all --reference --mutant`` runs everything and prints the table
(docs/figures/conformance.json).
"""

from __future__ import annotations

import pytest

from run import DEFAULT_POLICY, MUTANT, POLICIES, run_tests
from selection import CI, PASS_WITHOUT_REDUCTION, SELECTED

NAMES = [s.name for s in SELECTED]
FULL = ([pytest.param(("gradsched", p), id=p) for p in POLICIES]
        + [pytest.param(("torch", None), id="torch-ddp"), pytest.param((MUTANT, DEFAULT_POLICY), id="mutant")])


@pytest.fixture(scope="module")
def ci_outcomes() -> dict[str, dict]:
    return run_tests(list(CI), "gradsched", DEFAULT_POLICY)


@pytest.mark.parametrize("name", CI)
def test_pytorch_ddp_test_default_policy(ci_outcomes, name):
    outcome = ci_outcomes.get(name, {"outcome": "missing", "detail": "no result"})
    assert outcome["outcome"] == "passed", outcome["detail"]


@pytest.fixture(scope="module", params=FULL)
def full_run(request) -> tuple[str, dict[str, dict]]:
    target, policy = request.param
    return target, run_tests(NAMES, target, policy)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_pytorch_ddp_test(full_run, name):
    target, outcomes = full_run
    outcome = outcomes.get(name, {"outcome": "missing", "detail": "no result"})
    expected = "passed" if target != MUTANT or name in PASS_WITHOUT_REDUCTION else "failed"
    assert outcome["outcome"] == expected, outcome["detail"] or f"{name} passed on a gradsched that never reduces"
