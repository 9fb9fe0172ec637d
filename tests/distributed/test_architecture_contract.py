"""The contract every architecture keeps, for every policy (workers/architectures.py: each
scenario under PyTorch's DDP and under gradsched in the same processes, 2 gloo workers, a
third rank serving under ``ps``): plain steps with two parameter groups and a scheduler,
``step(closure)``, ``no_sync()``, ``require_backward_grad_sync``, clipping, uneven inputs,
communication hooks, compression, checkpoints resumed in a fresh wrap; under ``reducer``
(all-reduce whose trial keeps the buckets) every scenario runs past the hand-off to DDP's
reducer, ``step(closure)`` included, and the plane it retired has stopped its threads. What
an architecture refuses is listed below with its reason, and must be refused with a clear
error; everything else must equal DDP.

Tolerance: 1e-6 absolute (parameters of order 1), compressed runs included: against DDP with
PyTorch's bf16 hook, which under sharding steps fp32 masters of parameters that every forward
pass computes with rounded to bf16, as sharding with compression does.

The slow set runs every architecture x policy; ``make test`` one policy per architecture,
each architecture a different one.
"""

from __future__ import annotations

import json
import os

import pytest

from workers.launch import TESTS, run_ranks

TOLERANCE = 1e-6
POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
ARCHITECTURES = {"allreduce": 2, "ps": 3, "sharded": 2, "fully_sharded": 2, "reducer": 2}  # -> ranks
#: (architecture, scenario) -> what the refusal must say
REFUSED = {
    ("ps", "hook"): "a communication hook runs on all-reduce messages; with architecture='ps' .* the servers reduce",
    ("sharded", "hook"): "a communication hook runs on all-reduce messages; with architecture='sharded' messages "
                         "are reduce-scattered",
    ("sharded", "uneven"): "architecture='sharded' does not support uneven inputs yet .a joined rank would have "
                           "to update its shards",
    ("ps", "grad_sync"): "parameter servers .architecture='ps'. need gradsched.wrap",
    ("fully_sharded", "hook"): "a communication hook runs on all-reduce messages; with architecture='fully_sharded' "
                               "messages are reduce-scattered",
    ("fully_sharded", "uneven"): "architecture='fully_sharded' does not support uneven inputs yet .a joined rank "
                                 "would have to update its shards",
    ("fully_sharded", "compress"): "architecture='fully_sharded' does not support compression='bf16' yet",
}
#: scenarios in which the reducer architecture cannot hand off: inside join() the trial's
#: ranks never hold one control point together
NO_HANDOFF = {"uneven"}
QUICK = {"allreduce": "prophet", "ps": "bytescheduler", "sharded": "priority", "fully_sharded": "fifo",
         "reducer": "bytescheduler"}


def run(tmp_path, arch: str, policies: str, env: dict | None = None) -> list[dict]:
    out = tmp_path / arch
    results = run_ranks("architectures", ARCHITECTURES[arch], str(out), "--arch", arch, "--policies", policies,
                        timeout=900, env=env)
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((tmp_path / f"{arch}.rank{r}.json").read_text()) for r in range(ARCHITECTURES[arch])]


def check(reports: list[dict], arch: str) -> None:
    import re

    for rank, report in enumerate(reports):
        for key, entry in report.items():
            policy, scenario = key.split("/")
            where = f"{arch} rank {rank} {key}"
            refusal = REFUSED.get((arch, scenario))
            if refusal is not None:
                assert entry["error"] and re.search(refusal, entry["error"]), f"{where}: {entry}"
                continue
            assert entry["error"] is None, f"{where}: {entry['error']}"
            if rank >= 2:  # the server: it served every scenario
                continue
            assert entry["diff"] <= TOLERANCE, f"{where}: {entry['diff']} from DDP"
            if arch == "reducer" and policy != "fifo" and scenario not in NO_HANDOFF:  # fifo: nothing to measure
                assert entry["handed_off"] is not None, f"{where}: never handed off to DDP's reducer"
            assert entry["plane_threads"] == [], f"{where}: the retired plane's threads still run"


def test_the_contract_covers_every_architecture_a_user_can_name():
    from gradsched.core.architectures import NAMES

    assert set(ARCHITECTURES) == {*NAMES, "reducer"} and set(QUICK) == set(ARCHITECTURES)


@pytest.mark.torch_range
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_keeps_the_contract(tmp_path, arch):
    check(run(tmp_path, arch, QUICK[arch]), arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_keeps_the_contract_under_every_policy(tmp_path, arch):
    check(run(tmp_path, arch, ",".join(POLICIES)), arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_contract_fails_on_a_gradsched_that_never_reduces(tmp_path, arch):
    """tests/mutant's no-reduction: each rank keeps its own gradients, under every architecture
    (the hook scenario excepted: there DDP's own allreduce_hook reduces)."""
    env = {"GRADSCHED_MUTANT": "no-reduction",
           "PYTHONPATH": os.pathsep.join([str(TESTS / "mutant"), os.environ.get("PYTHONPATH", "")])}
    reports = run(tmp_path, arch, QUICK[arch], env=env)
    diffs = [entry["diff"] for report in reports[:2] for key, entry in report.items()
             if (arch, key.split("/")[1]) not in REFUSED and key.split("/")[1] != "hook" and entry["diff"] is not None]
    assert diffs and min(diffs) > 1e-3, f"{arch}: the contract's scenarios did not see the missing reduction: {diffs}"
