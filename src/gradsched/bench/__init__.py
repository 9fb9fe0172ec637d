"""``gradsched bench``: DDP against every policy on a real, bandwidth-limited cluster
emulated on one machine (network namespaces, veth, a bridge and tc)."""

from .netns import EmulatedCluster, available, remove_stale
from .config import BenchConfig
from .figures import Setting
from .runner import run_bench
from .workloads import REAL, REPLAY, workload

__all__ = ["BenchConfig", "EmulatedCluster", "REAL", "REPLAY", "Setting", "available", "remove_stale", "run_bench",
           "workload"]
