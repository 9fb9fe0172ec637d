"""The one place that chooses how a rank's messages travel: all-reduce among the workers, or
push and pull through parameter servers, either of them compressed on the wire; a
reduce-scatter to the shards' owners (``architecture="sharded"``); or a DDP communication hook
(all-reduce only, uncompressed: the hook chooses what travels)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.comm_hook import HookTransport, wire_dtype_of
from gradsched.runtime.comm.compression import Compressed, wire_dtype
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.ps import PushPull
from gradsched.runtime.comm.pairwise import pairwise_for
from gradsched.runtime.comm.sharded import ReduceScatter, Shards
from gradsched.runtime.comm.transport import AllReduce, Issued, Transport
from gradsched.runtime.device import Device


def make_transport(topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                   versions: PlanVersions, compression: str | None, device: Device,
                   comm_hook: tuple[Any, Callable] | None = None, shards: Shards | None = None) -> Transport:
    """The transport of a worker of ``topology`` whose gradients are ``params`` on ``device``
    (its sends issued through it: :class:`~gradsched.runtime.comm.transport.Issued`);
    ``comm_hook``: (state, hook), the state already given gradsched's data group
    (gradsched.runtime.comm.comm_hook)."""
    wire = wire_dtype(compression)
    if shards is not None:  # its all-gathers travel the way its reduce-scatters do
        shards.pairwise = pairwise_for(topology.data)
        transport: Transport = ReduceScatter(topology.data, shards.pairwise)
    elif comm_hook is not None:
        state, hook = comm_hook
        return Issued(HookTransport(hook, state, versions, dict(zip(names, params)), topology.rank), device,
                      topology.data)
    elif topology.servers:
        dtype_of = {n: wire or p.dtype for n, p in zip(names, params)}
        transport = PushPull(topology.data, topology.plans, topology.rank, topology.servers,
                             topology.num_workers, dtype_of, versions)
    else:
        transport = AllReduce(topology.data)
    transport = Issued(transport, device, topology.data)
    return transport if wire is None else Compressed(transport, wire)


def travelling_dtype(compression: str | None, comm_hook: tuple[Any, Callable] | None) -> torch.dtype | None:
    """The dtype gradients travel in where it is not their own: compression's, or a
    communication hook's where it is known (None: their own)."""
    return wire_dtype(compression) or (wire_dtype_of(comm_hook[1]) if comm_hook is not None else None)
