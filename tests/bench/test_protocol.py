"""What the runner tells a benchmark rank is a typed record (gradsched.bench.protocol): it
survives the trip through the worker's argument, and a run's variants are fields of it."""

from __future__ import annotations

import pytest

from gradsched.bench.protocol import Run, WorkerConfig
from gradsched.bench.runner import BenchConfig, _payload


def test_runs_name_their_variants():
    assert Run.named("prophet+clip", clip=0.5, autotune_trials=4) == Run("prophet", clip=0.5)
    assert Run.named("bytescheduler+autotune", clip=0.5, autotune_trials=4) == Run("bytescheduler", autotune_trials=4)
    assert Run.named("ddp-bf16").is_ddp and not Run.named("fifo").is_ddp
    assert Run.named("fsdp2-noreshard").is_fsdp and not Run.named("fsdp2").is_ddp and not Run.named("ddp").is_fsdp
    assert [Run.named(n, 1.0, 3).name for n in ("ddp+clip", "prophet+autotune", "fifo")] == \
        ["ddp+clip", "prophet+autotune", "fifo"]
    assert Run.named("prophet+sharded") == Run("prophet", sharded=True) and Run("fifo", sharded=True).name == "fifo+sharded"
    with pytest.raises(ValueError, match="unknown run variant"):
        Run.named("prophet+fast")


def test_sharded_rows_follow_each_policy_beside_all_reduce_only():
    config = BenchConfig(model="replay-mini", policies=("ddp", "ddp-zero", "prophet"), sharded=True)
    assert config.runs == ["ddp", "ddp-zero", "prophet", "prophet+sharded"]
    assert WorkerConfig.from_json(_payload(config, None, None)).runs[3] == Run("prophet", sharded=True)
    with pytest.raises(ValueError, match="--sharded runs beside all-reduce"):
        BenchConfig(model="replay-mini", sharded=True, arch="ps", servers=1, policies=("fifo",))
    assert BenchConfig(model="replay-mini", sharded=True, compression="bf16").runs[-1] == "prophet+sharded"


def test_the_payload_round_trips():
    config = BenchConfig(model="replay-mini", policies=("ddp", "prophet"), clip=1.0, autotune_trials=0,
                         arch="allreduce", dilation=3.0)
    sent = WorkerConfig.from_json(_payload(config, None, None))
    assert [r.name for r in sent.runs] == config.runs == ["ddp", "ddp+clip", "prophet", "prophet+clip"]
    assert sent.runs[1] == Run("ddp", clip=1.0) and sent.dilation == 3.0 and sent.servers == 0
    assert sent.options == {"prophet": config.policy_options("prophet")}
    assert WorkerConfig.from_json(sent.to_json()) == sent
