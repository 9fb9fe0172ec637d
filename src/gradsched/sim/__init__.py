"""The discrete-event simulator: the scheduler core driven by simulated time, and the plans
the runtime follows, made by the same loop."""

from .bounds import bound, dependency_bound
from .cluster import ARCHITECTURES, Cluster
from .network import make_network
from .plan_maker import default_ready_times, paced_ready_times, make_plan
from .predict import link_cluster, predict, scaled
from .simulator import SimResult, simulate

__all__ = ["ARCHITECTURES", "Cluster", "SimResult", "bound", "default_ready_times", "dependency_bound", "link_cluster",
           "make_network", "make_plan", "paced_ready_times", "predict", "scaled", "simulate"]
