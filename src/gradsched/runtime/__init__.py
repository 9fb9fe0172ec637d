"""The PyTorch runtime: ``gradsched.wrap`` over torch.distributed all-reduce."""

from .config import RuntimeConfig
from .errors import GradschedError
from .optimizer import ScheduledOptimizer
from .wrap import wrap

__all__ = ["GradschedError", "RuntimeConfig", "ScheduledOptimizer", "wrap"]
