"""gradsched: scheduling of gradient communication for data-parallel PyTorch training.

The main entry points, importable from here (loaded on first use, so ``import gradsched``
stays light):

>>> import gradsched
>>> table = gradsched.model_table("resnet50")
>>> cluster = gradsched.Cluster(workers=16, bandwidth_bps=10e9)
>>> round(gradsched.simulate(table, cluster, "fifo", iterations=5).iteration_s, 3)
0.184
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Scheduler": "gradsched.core",
    "TensorSpec": "gradsched.core",
    "policy_config": "gradsched.core",
    "POLICIES": "gradsched.core",
    "Cluster": "gradsched.sim",
    "simulate": "gradsched.sim",
    "ModelTable": "gradsched.models",
    "model_table": "gradsched.models",
    "wrap": "gradsched.runtime",
    "DistributedDataParallel": "gradsched.runtime",
    "GradschedError": "gradsched.runtime",
    "ScheduledOptimizer": "gradsched.runtime",
    "pipelined": "gradsched.runtime",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gradsched' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
