"""Auto-tuning of a policy's partition and credit sizes by Bayesian optimisation: an
ask/tell :class:`Tuner`, offline against the simulator (:func:`tune_offline`,
``gradsched tune``), or online inside a training run (``gradsched.wrap(..., autotune=True)``).

Needs the ``tune`` extra (Optuna); the names are loaded on first use, so the search space
(:mod:`gradsched.tune.space`) and the CLI's parser work without it."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TuneResult": "offline", "grid_search": "offline", "tune_offline": "offline",
    "Dimension": "space", "SearchSpace": "space", "default_space": "space",
    "Candidate": "tuner", "Tuner": "tuner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gradsched.tune' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
