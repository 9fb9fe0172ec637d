"""The project's own equality tests fail on a gradsched that never reduces (tests/mutant: each
rank's all-reduce hands back its own gradients, undivided, and no hand-off to DDP's reducer).

Each worker below is one that an equality test of the suite runs; here it runs with the mutant
in every rank, and its comparison with torch's DDP must show the difference its test would
fail on (more than that test's tolerance). A suite that still passed would guard nothing about
reduction (docs/conformance.md: PyTorch's own DDP tests, against the same mutant).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from workers.launch import TESTS, run_ranks

MUTANT = {"GRADSCHED_MUTANT": "no-reduction",
          "PYTHONPATH": os.pathsep.join([str(TESTS / "mutant"), os.environ.get("PYTHONPATH", "")])}


def test_the_mutant_is_what_it_says(tmp_path):
    """Under the mutant each rank keeps its own gradient: the ranks' weights drift apart."""
    out = tmp_path / "report.json"
    for result in run_ranks("everyday_calls", 2, str(out), "group", timeout=300, env=MUTANT):
        assert result.returncode == 0, result.stderr[-4000:]
    for report in json.loads(out.read_text()):
        for policy in ("fifo", "priority", "bytescheduler", "prophet"):
            assert report["group"][policy]["diff"] > 1e-3, policy  # test_everyday_calls' tolerance: 1e-6


@pytest.mark.parametrize("api", ["ddp", pytest.param("wrap", marks=pytest.mark.slow)])  # CI: one API
def test_the_ddp_contract_tests_fail_on_the_mutant(tmp_path, api):
    from test_ddp_contract import TOLERANCE

    out = tmp_path / "contract"
    for result in run_ranks("contract", 2, str(out), "--policy", "prophet", "--api", api, timeout=180, env=MUTANT):
        assert result.returncode == 0, result.stderr[-4000:]
    worst = 0.0
    for rank in range(2):
        report = torch.load(tmp_path / f"contract.rank{rank}.pt")
        for results in report.values():
            if results["ddp"] is None:
                continue
            for part, ddp in results["ddp"].items():
                for name, tensor in ddp.items():
                    ours = results["ours"][part][name]
                    if tensor is not None and ours is not None and tensor.numel():
                        worst = max(worst, (ours.double() - tensor.double()).abs().nan_to_num(float("inf")).max().item())
    assert worst > 100 * TOLERANCE


@pytest.mark.slow  # CI: the mutant's drift (above) and the contract tests failing on it
def test_the_drop_in_script_test_fails_on_the_mutant(tmp_path):
    from test_drop_in import TOLERANCE, differences, switched, DDP_IMPORT, OURS

    path = switched(tmp_path, "mutant", {DDP_IMPORT: OURS})
    outs = {}
    for name, script in (("ddp", "ddp_script"), ("ours", str(path))):
        outs[name] = tmp_path / f"{name}.pt"
        for result in run_ranks(script, 2, str(outs[name]), timeout=180, env=dict(MUTANT, GRADSCHED_POLICY="fifo")):
            assert result.returncode == 0, result.stderr[-4000:]
    assert differences(torch.load(outs["ours"]), torch.load(outs["ddp"])) > 100 * TOLERANCE
