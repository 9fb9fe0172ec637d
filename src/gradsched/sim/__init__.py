"""The discrete-event simulator: the scheduler core driven by simulated time."""

from .cluster import ARCHITECTURES, Cluster, bound
from .network import make_network
from .simulator import SimResult, simulate

__all__ = ["ARCHITECTURES", "Cluster", "SimResult", "bound", "make_network", "simulate"]
