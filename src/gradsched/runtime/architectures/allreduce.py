"""All-reduce among the workers (the default): every rank averages every gradient with every
other rank's, message by message, in the plan's order, and keeps a whole copy of the result.

A message travels as an all-reduce on gradsched's data group (the user's backend), compressed
on the wire where ``compression`` says so, or through the user's DDP communication hook. The
simulator predicts the measured trial on the probed link, and where the trial keeps DDP-style
buckets they go to DDP's own reducer from the next step on (:mod:`gradsched.runtime.architectures.reducer`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from gradsched.core.task import TensorSpec
from gradsched.runtime.training.architecture import Architecture, CommHook
from gradsched.runtime.architectures.reducer import DDPReducer
from gradsched.runtime.architectures.replicated import ReplicatedStepping
from gradsched.runtime.comm.comm_hook import HookTransport, wire_dtype_of
from gradsched.runtime.comm.compression import Compressed, wire_dtype
from gradsched.runtime.comm.plans import PlanVersions, tensor_specs
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transport import AllReduce as AllReduceTransport, Issued, Transport
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.device import Device
from gradsched.runtime.planning.link_model import LinkModel
from gradsched.runtime.architectures.on_plane import OnDataPlane
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.updates import DeferredUpdates


class AllReduce(OnDataPlane):
    name = "allreduce"

    def link_model(self) -> LinkModel:
        return LinkModel(probed=True)  # the simulator predicts the measured trial on the probed link

    def specs(self, names: Sequence[str], params: Sequence[torch.Tensor], topology: Topology,
              config: RuntimeConfig, comm_hook: CommHook | None) -> list[TensorSpec]:
        # the dtype gradients travel in where it is not their own: compression's, or a
        # communication hook's where it is known
        travelling = wire_dtype(config.compression) or (wire_dtype_of(comm_hook[1]) if comm_hook else None)
        return tensor_specs(names, params, travelling)

    def transport(self, topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                  versions: PlanVersions, config: RuntimeConfig, device: Device,
                  comm_hook: CommHook | None) -> Transport:
        if comm_hook is not None:  # the hook chooses what travels (its state already on the data group)
            state, hook = comm_hook
            return Issued(HookTransport(hook, state, versions, dict(zip(names, params)), topology.rank), device,
                          topology.data)
        return compressed(Issued(AllReduceTransport(topology.data), device, topology.data), config)

    def stepping(self, exchange: Exchange, handover: Handover, updates: DeferredUpdates, topology: Topology,
                 config: RuntimeConfig) -> ReplicatedStepping:
        return ReplicatedStepping(handover, updates)


    def handed_off(self, config: RuntimeConfig, workers: int) -> Architecture | None:
        return DDPReducer() if config.handoff and workers > 1 else None


def compressed(transport: Transport, config: RuntimeConfig) -> Transport:
    """``transport`` with every message travelling in ``compression``'s dtype, if one is set."""
    wire = wire_dtype(config.compression)
    return transport if wire is None else Compressed(transport, wire)
