"""Parameter servers (``architecture="ps"``): of a job of ``W + S`` processes, ranks ``0 .. W-1``
train and the last ``S`` serve. A worker pushes each message's gradients to the servers, each
server sums its chunk over the workers and divides it, and the worker pulls the average back
(:mod:`~gradsched.runtime.architectures.servers.pushpull`; the server's side:
:mod:`~gradsched.runtime.architectures.servers.server`).

On a server rank ``wrap()`` serves until the workers close their optimizers and then returns
(:meth:`ParameterServers.serve`): what the process does next, the script decides. Plans model
one direction of the link (push, or pull), and buffers travel on the workers' gloo group. What
it refuses: CUDA parameters and the NCCL backend (a server receives from every worker before it
answers, which NCCL's ordered point-to-point operations do not allow), DDP communication hooks
(the servers reduce), and the hand-off to DDP's reducer (DDP has no servers).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from gradsched.core.task import TensorSpec
from gradsched.runtime.architectures.allreduce import compressed
from gradsched.runtime.training.architecture import CommHook
from gradsched.runtime.architectures.replicated import ReplicatedStepping
from gradsched.runtime.architectures.servers.pushpull import PushPull
from gradsched.runtime.architectures.servers.server import Server
from gradsched.runtime.comm.compression import wire_dtype
from gradsched.runtime.comm.plans import PlanVersions, tensor_specs
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transport import Issued, Transport
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.device import Device
from gradsched.runtime.planning.link_model import LinkModel
from gradsched.runtime.architectures.on_plane import OnDataPlane
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.updates import DeferredUpdates


class ParameterServers(OnDataPlane):
    name = "ps"
    buffers_on_data_plane = False  # the data group holds the servers too
    comm_hook_refusal = "the servers reduce"

    def __init__(self, servers: int) -> None:
        self.servers = servers

    def __repr__(self) -> str:
        return f"architecture='ps' (servers={self.servers})"

    def refusals(self, params: Sequence[torch.Tensor], config: RuntimeConfig, backend: str) -> list[str]:
        refused = []
        if any(p.device.type != "cpu" for p in params):
            refused.append("architecture='ps' moves CPU tensors over gloo for now; use architecture='allreduce' "
                           "for CUDA parameters")
        if "nccl" in backend:
            refused.append("architecture='ps' needs the gloo backend: NCCL matches point-to-point operations by "
                           "their order, and a server receives from every worker before it answers "
                           "(init_process_group('gloo'), or architecture='allreduce' on NCCL)")
        return refused

    def specs(self, names: Sequence[str], params: Sequence[torch.Tensor], topology: Topology,
              config: RuntimeConfig, comm_hook: CommHook | None) -> list[TensorSpec]:
        return tensor_specs(names, params, wire_dtype(config.compression))

    def transport(self, topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                  versions: PlanVersions, config: RuntimeConfig, device: Device,
                  comm_hook: CommHook | None) -> Transport:
        pushpull = PushPull(topology.data, topology.plans, topology.rank, topology.servers, topology.num_workers,
                            _dtypes(names, params), versions, wire_dtype(config.compression))
        return compressed(Issued(pushpull, device, topology.data), config)

    def stepping(self, exchange: Exchange, handover: Handover, updates: DeferredUpdates, topology: Topology,
                 config: RuntimeConfig) -> ReplicatedStepping:
        return ReplicatedStepping(handover, updates)


    def link_model(self) -> LinkModel:
        """Messages timed from push to pull, spread over the servers."""
        return LinkModel(sim="ps", servers=self.servers, one_direction=True)

    def serve(self, model: nn.Module, names: Sequence[str], params: Sequence[torch.Tensor],
              config: RuntimeConfig, topology: Topology) -> None:
        """Serve until the workers close their optimizers; then let go of gradsched's groups and
        return (the user's process group, and the process, stay the user's)."""
        try:
            Server(topology, _dtypes(names, params), config.timeout, wire_dtype(config.compression)).run()
        finally:
            topology.release()


def _dtypes(names: Sequence[str], params: Sequence[torch.Tensor]) -> dict:
    """Each gradient's dtype, by name (every rank checked the model's dtypes and the options equal)."""
    return {n: p.dtype for n, p in zip(names, params)}
