"""Sharded data parallelism (``architecture="sharded"``): every rank owns 1/n of each parameter
and of its optimizer state. Backward reduce-scatters each message (every rank receives the
average of its own shard), ``step()`` runs the user's optimizer on this rank's shards only and
all-gathers the updated parameters message by message, the first layers' first, and each
module's forward pass waits for its own parameters' all-gathers.

* :mod:`~gradsched.runtime.architectures.sharded.shards`: the shards, the plans' coordinates
  over them, how a message's gradients are packed, and the reduce-scatter transport;
* :mod:`~gradsched.runtime.architectures.sharded.stepping`: the training thread's side.

Plans model a message as one all-reduce's time (the link estimate learns its bytes' speed);
the measured trial is decided by measurement alone. What it refuses: optimizers that need
whole tensors, CUDA parameters (for now), non-contiguous parameters, ``find_unused_parameters``,
DDP communication hooks (messages are reduce-scattered), ``join()`` and the hand-off to DDP's
reducer (which would hold the whole state again).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import torch

from gradsched.core.task import TensorSpec
from gradsched.runtime.architectures.allreduce import compressed
from gradsched.runtime.architectures.base import Architecture, CommHook
from gradsched.runtime.architectures.sharded.shards import ReduceScatter, ShardedLayout, Shards
from gradsched.runtime.architectures.sharded.stepping import ShardedStep, check_elementwise
from gradsched.runtime.comm.pairwise import pairwise_for
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transport import Issued, Transport
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.device import Device
from gradsched.runtime.training.plane import Plane


class Sharded(Architecture):
    name = "sharded"
    hands_out_dtensors = True
    comm_hook_refusal = "messages are reduce-scattered"
    join_refusal = ("a joined rank would have to update its shards and serve the all-gathers; use "
                    "architecture='allreduce', or give every rank the same number of batches")

    def __init__(self) -> None:
        self.shards: Shards | None = None  # this rank's (built with the plans' specs)

    def refusals(self, params: Sequence[torch.Tensor], config: RuntimeConfig, backend: str) -> list[str]:
        refused = [
            (any(p.device.type != "cpu" for p in params), "CUDA parameters (it runs on CPU tensors for now)"),
            (not all(p.is_contiguous() for p in params), "non-contiguous parameters (each is sharded as a flat view)"),
            (config.find_unused_parameters, "find_unused_parameters=True"),
        ]
        return [f"architecture='sharded' does not support {what} yet; use architecture='allreduce'"
                for failed, what in refused if failed]

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        check_elementwise(optimizer)

    def specs(self, names: Sequence[str], params: Sequence[torch.Tensor], topology: Topology,
              config: RuntimeConfig, comm_hook: CommHook | None) -> list[TensorSpec]:
        self.shards = Shards(names, params, topology.rank, topology.num_workers, config.compression)
        return self.shards.specs()

    def transport(self, topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                  versions: PlanVersions, config: RuntimeConfig, device: Device,
                  comm_hook: CommHook | None) -> Transport:
        from torch.distributed.device_mesh import DeviceMesh

        self.shards.pairwise = pairwise_for(topology.data)  # its all-gathers travel the way its reduce-scatters do
        self.shards.mesh = DeviceMesh.from_group(topology.tensors, params[0].device.type)
        return compressed(Issued(ReduceScatter(topology.data, self.shards.pairwise), device, topology.data), config)

    def layout(self) -> Any:
        shards = self.shards
        return lambda plan: ShardedLayout(shards)

    def stepping(self, exchange: Any, handover: Any, updates: Any, topology: Topology,
                 config: RuntimeConfig) -> ShardedStep:
        return ShardedStep(self.shards, exchange, partial(getattr, topology, "data"), handover, updates,
                           config.timeout)

    def open(self, co: Any) -> Plane:
        return Plane(co, self)
