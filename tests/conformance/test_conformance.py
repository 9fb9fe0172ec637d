"""PyTorch's own DDP tests (the selection of selection.py, from the installed torch) against
``gradsched.DistributedDataParallel``, gloo, 2 ranks: each must pass.

The default policy runs here on every test run; the three others, and PyTorch's own DDP on the
same copy (the reference: it must pass them all too), are marked slow. ``run.py --policy all
--reference`` runs everything and prints the table (docs/figures/conformance.json).
"""

from __future__ import annotations

import pytest

from run import DEFAULT_POLICY, POLICIES, run_tests
from selection import SELECTED

NAMES = [s.name for s in SELECTED]
RUNS = [pytest.param(("gradsched", p), id=p, marks=() if p == DEFAULT_POLICY else pytest.mark.slow)
        for p in POLICIES] + [pytest.param(("torch", None), id="torch-ddp", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=RUNS)
def outcomes(request) -> dict[str, dict]:
    target, policy = request.param
    return run_tests(NAMES, target, policy)


@pytest.mark.parametrize("name", NAMES)
def test_pytorch_ddp_test(outcomes, name):
    outcome = outcomes.get(name, {"outcome": "missing", "detail": "no result"})
    assert outcome["outcome"] == "passed", outcome["detail"]
