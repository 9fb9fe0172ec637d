"""torch.distributed.checkpoint round trips (workers/dcp.py): ``get_state_dict`` and ``dcp.save``
under one architecture, ``get_state_dict`` on a fresh model and optimizer (whose state torch
makes with a step on zeros), ``dcp.load`` and ``set_state_dict`` under another, or on another
number of ranks, as DCP allows. The model and the optimizer's whole state must equal what was
saved, exactly; on the save's ranks the next steps must end where the uninterrupted run ends
(exactly under the same architecture; within 1e-6 across architectures, whose sums of the
averaged gradients may round apart). PyTorch's FSDP2 and DDP take part as architectures too."""

from __future__ import annotations

import json

import pytest

from workers.launch import run_ranks


def side(tmp_path, what: str, world: int, architecture: str, api: str = "ddp", model: str = "rows") -> list[dict]:
    out = tmp_path / f"{what}-{architecture}-{world}.json"
    for result in run_ranks("dcp", world, what, str(tmp_path), str(out), "--architecture", architecture,
                            "--api", api, "--model", model, timeout=180):
        assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


def round_trip(tmp_path, saved: str, loaded: str, world: int = 2, api: str = "ddp", model: str = "rows") -> None:
    side(tmp_path, "save", 2, saved, api, model)
    for rank, report in enumerate(side(tmp_path, "load", world, loaded, api, model)):
        where = f"rank {rank}: {saved} -> {loaded} on {world} ranks"
        assert report["params"] == 0.0 and report["state"] == 0.0, (where, report)
        if "final" in report:
            assert report["final"] <= (0.0 if saved == loaded else 1e-6), (where, report)


@pytest.mark.torch_range  # DCP's planner and DTensor's placements across the supported torch versions
@pytest.mark.parametrize("saved,loaded,world", [("sharded", "sharded", 2), ("sharded", "allreduce", 3),
                                                ("allreduce", "fully_sharded", 2)])
def test_a_checkpoint_round_trips_across_architectures_and_ranks(tmp_path, saved, loaded, world):
    round_trip(tmp_path, saved, loaded, world)


@pytest.mark.parametrize("saved,loaded,world", [("fsdp2", "sharded", 2), ("fully_sharded", "fsdp2", 2),
                                                ("ddp", "fully_sharded", 3)])
def test_checkpoints_move_between_pytorchs_fsdp2_or_ddp_and_gradsched(tmp_path, saved, loaded, world):
    """FSDP2's users resume their checkpoints under gradsched, and back (``fsdp2``: torch's
    ``fully_shard`` on every layer; ``ddp``: torch's DDP)."""
    round_trip(tmp_path, saved, loaded, world)


@pytest.mark.slow
@pytest.mark.parametrize("saved,loaded,world,api", [
    ("fully_sharded", "fully_sharded", 2, "ddp"), ("fully_sharded", "sharded", 3, "ddp"),
    ("sharded", "fully_sharded", 3, "wrap"), ("allreduce", "sharded", 3, "wrap"), ("sharded", "sharded", 2, "wrap")])
def test_more_round_trips(tmp_path, saved, loaded, world, api):
    round_trip(tmp_path, saved, loaded, world, api)


@pytest.mark.torch_range  # what set_state_dict requires of every rank differs across torch versions
@pytest.mark.parametrize("saved,loaded,world", [("sharded", "allreduce", 2), ("allreduce", "sharded", 3),
                                                ("fully_sharded", "sharded", 2),
                                                pytest.param("sharded", "fully_sharded", 3, marks=pytest.mark.slow),
                                                pytest.param("sharded", "sharded", 3, marks=pytest.mark.slow)])
def test_empty_shards_and_a_0_dimensional_parameter_round_trip(tmp_path, saved, loaded, world):
    """A weight of one row (every rank but rank 0 holds an empty shard of it, and no state) and
    a 0-dimensional parameter (rank 0's alone) saved and loaded across architectures and ranks."""
    round_trip(tmp_path, saved, loaded, world, model="edges")
