"""The one place that reads the ``architecture`` option: the architecture object of a wrap.

>>> choose(RuntimeConfig())
architecture='allreduce'
>>> choose(RuntimeConfig(architecture="ps", servers=2))
architecture='ps' (servers=2)
>>> choose(RuntimeConfig(architecture="ring"))
Traceback (most recent call last):
...
ValueError: architecture must be 'allreduce', 'ps', 'sharded' or 'fully_sharded', got 'ring'
"""

from __future__ import annotations

from gradsched.core.architectures import NAMES, kind
from gradsched.runtime.architectures.allreduce import AllReduce
from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.architectures.servers import ParameterServers
from gradsched.runtime.architectures.sharded import FullySharded, Sharded
from gradsched.runtime.config import RuntimeConfig

__all__ = ["BUILT", "NAMES", "choose"]  # NAMES: the one list (gradsched.core.architectures)

#: what each name a user may give builds (DDP's reducer is handed off to, never named)
BUILT = {"allreduce": AllReduce, "ps": ParameterServers, "sharded": Sharded, "fully_sharded": FullySharded}


def choose(config: RuntimeConfig) -> Architecture:
    """The architecture ``config`` names, its options checked (a ``ValueError`` says what to fix)."""
    chosen, servers = kind(config.architecture), config.servers  # (raises for a name not in the list)
    if chosen.servers:
        if servers < 1:
            raise ValueError(f"architecture={chosen.name!r} needs servers >= 1, got {servers}")
        return BUILT[chosen.name](servers)
    if servers:
        raise ValueError("servers only apply to architecture='ps'")
    return BUILT[chosen.name]()
