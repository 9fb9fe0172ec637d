"""Auto-tuning of a policy's partition and credit sizes by Bayesian optimisation: an
ask/tell :class:`Tuner`, offline against the simulator (:func:`tune_offline`,
``gradsched tune``), or online inside a training run (``gradsched.wrap(..., autotune=True)``)."""

from .offline import TuneResult, grid_search, tune_offline
from .space import Dimension, SearchSpace, default_space
from .tuner import Candidate, Tuner

__all__ = ["Candidate", "Dimension", "SearchSpace", "TuneResult", "Tuner", "default_space", "grid_search",
           "tune_offline"]
