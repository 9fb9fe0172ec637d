"""What the runner tells a benchmark rank is a typed record (gradsched.bench.protocol): it
survives the trip through the worker's argument, and a run's variants are fields of it."""

from __future__ import annotations

import pytest

from gradsched.bench.protocol import Run, WorkerConfig
from gradsched.bench.config import BenchConfig
from gradsched.bench.launch import payload


def test_runs_name_their_variants():
    assert [r.name for r in (Run("prophet", clip=0.5), Run("bytescheduler", autotune_trials=4), Run("fifo", sharded=True),
                             Run("ddp"))] == ["prophet+clip", "bytescheduler+autotune", "fifo+sharded", "ddp"]
    assert Run("ddp-bf16").is_ddp and not Run("fifo").is_ddp
    assert Run("fsdp2-noreshard").is_fsdp and not Run("fsdp2").is_ddp and not Run("ddp").is_fsdp


def test_the_config_lists_runs_as_records_not_names():
    config = BenchConfig(model="replay-mini", policies=("ddp", "bytescheduler"), clip=0.5, autotune_trials=4)
    assert config.runs == [Run("ddp"), Run("ddp", clip=0.5), Run("bytescheduler"),
                           Run("bytescheduler", autotune_trials=4), Run("bytescheduler", clip=0.5)]
    assert config.run_named("bytescheduler+autotune") == Run("bytescheduler", autotune_trials=4)


def test_sharded_rows_follow_each_policy_beside_all_reduce_only():
    config = BenchConfig(model="replay-mini", policies=("ddp", "ddp-zero", "prophet"), sharded=True)
    assert [r.name for r in config.runs] == ["ddp", "ddp-zero", "prophet", "prophet+sharded"]
    assert WorkerConfig.from_json(payload(config, None, None)).runs[3] == Run("prophet", sharded=True)
    with pytest.raises(ValueError, match="--sharded and --fully-sharded run beside all-reduce"):
        BenchConfig(model="replay-mini", sharded=True, arch="ps", servers=1, policies=("fifo",))
    assert BenchConfig(model="replay-mini", sharded=True, compression="bf16").runs[-1].name == "prophet+sharded"


def test_fully_sharded_rows_follow_each_policy_and_name_their_architecture():
    config = BenchConfig(model="replay-mini", policies=("ddp", "fsdp2", "prophet"), sharded=True, fully_sharded=True)
    assert [r.name for r in config.runs] == ["ddp", "fsdp2", "prophet", "prophet+sharded", "prophet+fully_sharded"]
    sent = WorkerConfig.from_json(payload(config, None, None)).runs
    assert sent[4] == Run("prophet", fully_sharded=True)
    assert [r.architecture for r in sent[2:]] == [{}, {"architecture": "sharded"}, {"architecture": "fully_sharded"}]


def test_the_payload_round_trips():
    config = BenchConfig(model="replay-mini", policies=("ddp", "prophet"), clip=1.0, autotune_trials=0,
                         arch="allreduce", dilation=3.0)
    sent = WorkerConfig.from_json(payload(config, None, None))
    assert list(sent.runs) == config.runs and [r.name for r in sent.runs] == ["ddp", "ddp+clip", "prophet", "prophet+clip"]
    assert sent.runs[1] == Run("ddp", clip=1.0) and sent.dilation == 3.0 and sent.servers == 0
    assert sent.options == {"prophet": config.policy_options("prophet")}
    assert WorkerConfig.from_json(sent.to_json()) == sent


def test_the_report_names_the_sizes_a_policy_derived():
    """The text report's plan column: the options a policy derives from the link (its
    defaults None), as the plan in use had them; nothing for a policy with fixed sizes."""
    from gradsched.bench.report import derived_options

    options = {"amortise": 9.0, "credit_bytes": 12 << 20, "fuse_bytes": 0, "partition_bytes": 4 << 20}
    assert derived_options("bytescheduler", options) == {"credit_bytes": 12 << 20, "partition_bytes": 4 << 20}
    assert derived_options("prophet", {"partition_bytes": 1 << 18, "credit_bytes": 16 << 20}) == {}
    assert derived_options("bytescheduler", None) == {} and derived_options("buckets 25 MB", options) == {}


def test_rank_zeros_lines_route_progress_and_finished_runs_apart_from_the_result():
    """Each run's end is reported as it comes (a timeout later still names it); the result is
    the one line of another kind; the rest of rank 0's output is left alone."""
    import json
    import os

    from gradsched.bench.processes import read_result
    from gradsched.bench.protocol import MARK

    lines = [MARK + json.dumps({"kind": "progress", "policy": "ddp", "index": 0, "total": 3}),
             "a line of the user's own",
             MARK + json.dumps({"kind": "finished", "policy": "ddp", "median_s": 0.3}),
             MARK + json.dumps({"kind": "result", "policies": {}})]
    reading, writing = os.pipe()
    os.write(writing, ("\n".join(lines) + "\n").encode())
    os.close(writing)
    heard = []
    try:
        result = read_result(reading, heard.append)
    finally:
        os.close(reading)
    assert [m["kind"] for m in heard] == ["progress", "finished"] and heard[1]["median_s"] == 0.3
    assert result == {"kind": "result", "policies": {}}


def test_a_failed_run_shows_the_rank_that_crashed_not_the_one_whose_peer_went_away():
    """Rank 0 fails only because rank 1 crashed (gloo: connection closed by peer): the error
    shows rank 1's log; a run where every failure is of that kind shows the first."""
    import subprocess
    import sys

    from gradsched.bench.processes import Processes

    def run(*said: str) -> str:
        processes = Processes(None, torchrun=False)
        try:
            for text in said:
                processes.start(0, [sys.executable, "-c", f"import sys; sys.exit({text!r})"], {}, subprocess.DEVNULL)
            for proc in processes.procs:
                proc.wait(timeout=60)
            return processes.failure(None)
        finally:
            processes.close()

    crashed = run("RuntimeError: Connection closed by peer [10.0.0.2]:1", "ZeroDivisionError: integer modulo by zero")
    assert crashed.startswith("benchmark rank 1 failed") and "ZeroDivisionError" in crashed
    both = run("Connection reset by peer", "Connection closed by peer")
    assert both.startswith("benchmark rank 0 failed") and "reset" in both
