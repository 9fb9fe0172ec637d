"""The parameter-server architecture with real processes over gloo and real TCP, against
DDP over the workers only. Tolerance: 1e-5 absolute on parameters and buffers (a server sums
in worker order, so 2 workers give DDP's sums exactly; 3 may differ in rounding)."""

from __future__ import annotations

import json

import pytest

from workers.launch import run_ranks

TOLERANCE = 1e-5


def check(results, out, policies, optimizers) -> None:
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    ranks = json.loads(out.read_text())["ranks"]
    assert sorted(ranks[0]) == sorted(f"{p}/{o}" for p in policies for o in optimizers)
    for case, result in ranks[0].items():
        assert result["max_abs_diff"] <= TOLERANCE, case
        assert result["moved"] > 1e-2, case  # training did happen
        assert result["plans_adopted"] >= 3, case  # measured plans were made and sent to the servers
        assert result["plan_policy"] == case.split("/")[0], case
        assert all(r[case]["checksum"] == result["checksum"] for r in ranks), case


@pytest.mark.parametrize("world,servers,delays", [pytest.param(3, 1, False, marks=pytest.mark.slow), (4, 2, True)])
def test_policies_match_ddp_with_parameter_servers(tmp_path, world, servers, delays):
    out = tmp_path / "out.json"
    # the default set: fifo and prophet here, bytescheduler in the contract suite
    # (tests/distributed/test_architecture_contract.py); every policy in the slow set
    policies = ["fifo", "priority", "bytescheduler", "prophet"] if not delays else ["fifo", "prophet"]
    optimizers = ["sgd", "adam"]
    extra = ["--delays"] if delays else []
    check(run_ranks("ps_compare", world, str(out), "--servers", str(servers), "--policies", ",".join(policies),
                    *extra, timeout=240), out, policies, optimizers)


def test_servers_answering_in_pieces_of_a_few_hundred_bytes_match_ddp(tmp_path):
    """Every chunk cut into many pieces (up to 64), each summed and answered on its own."""
    out = tmp_path / "out.json"
    check(run_ranks("ps_compare", 4, str(out), "--servers", "2", "--policies", "fifo,prophet", "--optimizers",
                    "adam", timeout=240, env={"GRADSCHED_PS_PIECE_BYTES": "256"}), out, ["fifo", "prophet"], ["adam"])


@pytest.mark.slow  # CI: 2 workers + 2 servers above, and 2 + 1 in the dead-rank test
def test_three_workers_one_server(tmp_path):
    """A server averaging 3 workers: plain SGD, whose step is proportional to the average
    (a divisor of 2 or 4 would show), against DDP over the 3 workers."""
    out = tmp_path / "out.json"
    check(run_ranks("ps_compare", 4, str(out), "--servers", "1", "--optimizers", "sgd", timeout=240), out,
          ["fifo", "priority", "bytescheduler", "prophet"], ["sgd"])


@pytest.mark.parametrize("compression", ["bf16", "fp16"])
def test_compression_with_parameter_servers(tmp_path, compression):
    """Workers push bf16/fp16 and the server sums in float32, divides, and answers in the wire
    dtype: more accurate than DDP + hook (which sums in the wire dtype), so the bound is on
    accuracy: the mean distance from uncompressed DDP at most DDP + hook's (plus 1e-7), and
    at most 1e-3 from DDP + hook anywhere. 2 workers + 1 server, SGD."""
    out = tmp_path / "out.json"
    results = run_ranks("ps_compare", 3, str(out), "--servers", "1", "--optimizers", "sgd",
                        "--compression", compression, timeout=240)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    ranks = json.loads(out.read_text())["ranks"]
    assert sorted(ranks[0]) == [f"{p}/sgd" for p in sorted(["fifo", "priority", "bytescheduler", "prophet"])]
    for case, result in ranks[0].items():
        assert result["max_abs_diff"] <= 1e-3, case
        assert result["mean_error"] <= result["ddp_mean_error"] + 1e-7, case
        assert result["moved"] > 1e-2, case


@pytest.mark.parametrize("victim,what", [(1, "a worker"), pytest.param(2, "the server", marks=pytest.mark.slow)])
def test_a_dead_rank_stops_the_others_with_a_clear_error(victim, what):
    results = run_ranks("death", 3, timeout=90, env={"VICTIM": str(victim), "SERVERS": "1"})
    assert results[victim].returncode == -9
    for rank, r in enumerate(results):
        if rank == victim:
            continue
        assert r.returncode != 0, r.stderr[-3000:]
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["type"] == "GradschedError", report
        assert "server" in report["message"], report
        assert report["seconds_after_last_step"] < 10, report  # as its connections drop (docs/guide.md, "Checks and errors")
