"""Fixtures shared by the test suite."""

from __future__ import annotations

import pytest
import torch.distributed as dist

# The conformance suite's runner modules are imported by its child processes only: suite.py
# imports PyTorch's ported DDP tests, which read BACKEND and WORLD_SIZE at import.
collect_ignore = ["conformance/suite.py", "conformance/target.py", "conformance/run.py",
                  "workers"]  # the rank programs, run by the multi-process tests (workers/launch.py)


@pytest.fixture
def world_of_one(tmp_path):
    """A real gloo process group of one rank in this process (torn down afterwards)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
