"""The one place that chooses how a rank's messages travel: all-reduce among the workers, or
push and pull through parameter servers, either of them compressed on the wire."""

from __future__ import annotations

from typing import Sequence

import torch

from ..topology import Topology
from .compression import Compressed, wire_dtype
from .plans import PlanVersions
from .ps import PushPull
from .transport import AllReduce, Transport


def make_transport(topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                   versions: PlanVersions, compression: str | None) -> Transport:
    """The transport of a worker of ``topology`` whose gradients are ``params``."""
    wire = wire_dtype(compression)
    if topology.servers:
        dtype_of = {n: wire or p.dtype for n, p in zip(names, params)}
        transport: Transport = PushPull(topology.data, topology.plans, topology.rank, topology.servers,
                                        topology.num_workers, dtype_of, versions)
    else:
        transport = AllReduce(topology.data)
    return transport if wire is None else Compressed(transport, wire)
