"""DDP's contract kept by gradsched (contract.py: PyTorch's DDP and gradsched side by side on
2 gloo ranks, every policy, through gradsched.DistributedDataParallel and gradsched.wrap):
unused parameters settled when backward ends (their gradients read at once as DDP's, None
where no rank used them), undefined gradients, create_graph=True, zero-size layers, join()
without an optimizer, a module wrapped again, the wrapper pickled and reloaded; a gradient
that can never be reduced fails at once instead of hanging.

Tolerance: 1e-6 absolute (gradients and parameters of order 1).
"""

from __future__ import annotations

import json

import pytest
import torch

from workers.launch import run_ranks

TOLERANCE = 1e-6
POLICIES = ("fifo", "priority", "bytescheduler", "prophet")


def run(tmp_path, policy: str, api: str) -> list[dict]:
    out = tmp_path / f"{policy}-{api}"
    results = run_ranks("contract", 2, str(out), "--policy", policy, "--api", api, timeout=180)
    reports = []
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr[-4000:]
        errors = json.loads((tmp_path / f"{out.name}.rank{rank}.json").read_text())
        assert not errors, "\n".join(errors.values())
        reports.append(torch.load(tmp_path / f"{out.name}.rank{rank}.pt"))
    return reports


def assert_same(ours: dict, ddp: dict, where: str) -> None:
    assert ours.keys() == ddp.keys(), where
    for name in ddp:
        if ddp[name] is None:
            assert ours[name] is None, f"{where}: {name} is {ours[name]}, DDP's is None"
        else:
            assert ours[name] is not None, f"{where}: {name} is None, DDP's is not"
            torch.testing.assert_close(ours[name], ddp[name], rtol=0, atol=TOLERANCE, msg=f"{where}: {name}")


@pytest.mark.parametrize("api", ["ddp", "wrap"])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_ddp_contract(tmp_path, policy, api):
    reports = run(tmp_path, policy, api)
    for rank, report in enumerate(reports):
        first = report["unused_after_backward"]["ddp"]["first"]
        assert first["b.weight"] is None and first["c.weight"] is not None  # c: used on rank 1 only
        for scenario, results in report.items():
            if results["ddp"] is None:
                continue
            for part in results["ddp"]:
                assert_same(results["ours"][part], results["ddp"][part], f"rank {rank} {scenario} {part}")
        never = report["never_reduced"]["ours"]
        assert "can never complete" in never["raised"] and "b.weight" in never["raised"]
        assert never["seconds"] < 10.0  # at once: the timeout is 60 s
    assert_same(reports[0]["unused_after_backward"]["ours"]["first"],
                reports[1]["unused_after_backward"]["ours"]["first"], "rank 0 against rank 1")
