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

from gradsched.runtime.architectures.allreduce import AllReduce
from gradsched.runtime.architectures.base import Architecture
from gradsched.runtime.architectures.servers import ParameterServers
from gradsched.runtime.architectures.sharded import FullySharded, Sharded
from gradsched.runtime.config import RuntimeConfig

#: what a user may name, and what each builds (DDP's reducer is handed off to, never named)
NAMES = ("allreduce", "ps", "sharded", "fully_sharded")


def choose(config: RuntimeConfig) -> Architecture:
    """The architecture ``config`` names, its options checked (a ``ValueError`` says what to fix)."""
    name, servers = config.architecture, config.servers
    if name not in NAMES:
        raise ValueError(f"architecture must be {', '.join(map(repr, NAMES[:-1]))} or {NAMES[-1]!r}, got {name!r}")
    if name == "ps":
        if servers < 1:
            raise ValueError(f"architecture='ps' needs servers >= 1, got {servers}")
        return ParameterServers(servers)
    if servers:
        raise ValueError("servers only apply to architecture='ps'")
    built = {"sharded": Sharded, "fully_sharded": FullySharded, "allreduce": AllReduce}
    return built[name]()
