"""gradsched: scheduling of gradient communication for data-parallel PyTorch training."""

__version__ = "0.1.0"
