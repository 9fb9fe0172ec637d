"""The PyTorch runtime: ``gradsched.wrap`` over torch.distributed all-reduce or parameter servers."""

from gradsched.runtime.comm.comm_hook import pipelined
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.frontend.ddp import DistributedDataParallel
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.frontend.optimizer import ScheduledOptimizer
from gradsched.runtime.diagnostics.stats import Prediction, RunStats
from gradsched.runtime.frontend.wrap import wrap

__all__ = ["DistributedDataParallel", "GradschedError", "Prediction", "RunStats", "RuntimeConfig", "ScheduledOptimizer", "pipelined", "wrap"]
