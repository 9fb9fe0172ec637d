"""The PyTorch runtime: ``gradsched.wrap`` over torch.distributed all-reduce or parameter servers."""

from .comm.comm_hook import pipelined
from .config import RuntimeConfig
from .ddp import DistributedDataParallel
from .errors import GradschedError
from .optimizer import ScheduledOptimizer
from .stats import Prediction, RunStats
from .wrap import wrap

__all__ = ["DistributedDataParallel", "GradschedError", "Prediction", "RunStats", "RuntimeConfig", "ScheduledOptimizer", "pipelined", "wrap"]
