"""Sharded data parallelism (``architecture="sharded"``): every rank owns 1/n of each parameter
and of its optimizer state. Backward reduce-scatters each message (every rank receives the
average of its own shard), ``step()`` runs the user's optimizer on this rank's shards only and
all-gathers the updated parameters message by message, the first layers' first, and each
module's forward pass waits for its own parameters' all-gathers.

* :mod:`~gradsched.runtime.architectures.sharded.shards`: the shards, the plans' coordinates
  over them, how a message's gradients are packed, and the reduce-scatter transport;
* :mod:`~gradsched.runtime.architectures.sharded.stepping`: the training thread's side;
* :mod:`~gradsched.runtime.architectures.sharded.full`: ``architecture="fully_sharded"``
  (:class:`FullySharded`), the parameters sharded too between uses.

Plans model a message as one all-reduce's time (the link estimate learns its bytes' speed);
the measured trial is decided by measurement alone. On gloo (the host) both phases travel as
point-to-point operations; on NCCL (CUDA, and its emulation on CPU) as ``reduce_scatter_tensor``
and ``all_gather_into_tensor`` (see :mod:`.shards`). What it refuses: optimizers that need
whole tensors, parameters neither on the CPU nor on CUDA (meta: materialize them first), CUDA
parameters over gloo, non-contiguous parameters, DDP communication hooks (messages are
reduce-scattered), ``join()`` and the hand-off to DDP's reducer (which would hold the whole
state again). AMP's ``GradScaler`` works unchanged: its
overflow check on the DTensor gradients is agreed over every rank's shards by torch.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Sequence

import torch

from gradsched.core.engine import default_hold
from gradsched.core.task import TensorSpec
from gradsched.runtime.architectures.allreduce import compressed
from gradsched.runtime.training.architecture import CommHook
from gradsched.runtime.architectures.sharded.full import MiB, FullyShardedStep, Gatherer
from gradsched.runtime.architectures.sharded.shards import ReduceScatter, ShardedLayout, Shards
from gradsched.runtime.architectures.sharded.stepping import ShardedStep, check_elementwise
from gradsched.runtime.comm.pairwise import pairwise_for
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transport import Issued, Transport
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.device import Device
from gradsched.runtime.architectures.on_plane import OnDataPlane
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.updates import DeferredUpdates


def _bytes(mib: float) -> int:
    """A budget option given in MiB, in bytes (at least one)."""
    return max(1, int(mib * MiB))


class Sharded(OnDataPlane):
    name = "sharded"
    hands_out_dtensors = True
    comm_hook_refusal = "messages are reduce-scattered"
    join_refusal = ("a joined rank would have to update its shards and serve the all-gathers; use "
                    "architecture='allreduce', or give every rank the same number of batches")

    separate_shards = False  # each shard memory of its own, apart from its parameter's

    def __init__(self) -> None:
        self.shards: Shards | None = None  # this rank's (built with the plans' specs)

    def refusals(self, params: Sequence[torch.Tensor], config: RuntimeConfig, backend: str) -> list[str]:
        elsewhere = sorted({p.device.type for p in params} - {"cpu", "cuda"})  # meta, ...
        refused = [
            (bool(elsewhere), f"parameters on {', '.join(elsewhere)} (it shards CPU and CUDA tensors)"),
            (backend == "gloo" and any(p.is_cuda for p in params),
             "CUDA parameters over gloo (on CUDA its collectives are NCCL's: init_process_group('nccl'))"),
            (not all(p.is_contiguous() for p in params), "non-contiguous parameters (each is sharded as a flat view)"),
        ]
        return [f"architecture={self.name!r} does not support {what} yet; use architecture='allreduce'"
                for failed, what in refused if failed]

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        check_elementwise(optimizer)

    def specs(self, names: Sequence[str], params: Sequence[torch.Tensor], topology: Topology,
              config: RuntimeConfig, comm_hook: CommHook | None) -> list[TensorSpec]:
        self.shards = Shards(names, params, topology.rank, topology.num_workers, config.compression,
                             separate=self.separate_shards)
        return self.shards.specs()

    def transport(self, topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                  versions: PlanVersions, config: RuntimeConfig, device: Device,
                  comm_hook: CommHook | None) -> Transport:
        from torch.distributed.device_mesh import DeviceMesh

        # its all-gathers travel the way its reduce-scatters do
        self.shards.pairwise = pairwise_for(topology.data, device)
        self.shards.mesh = DeviceMesh.from_group(topology.tensors, params[0].device.type)
        self.shards.device = device
        reduce_scatter = ReduceScatter(topology.data, self.shards.pairwise, self.shards.into, self.before_reducing())
        return compressed(Issued(reduce_scatter, device, topology.data), config)

    def before_reducing(self) -> Callable[[], None] | None:
        """What each reduce-scatter waits for before it starts (nothing: the plan decides alone)."""
        return None

    def hold_bytes(self, params: Sequence[torch.Tensor], config: RuntimeConfig) -> int | None:
        """``gradient_budget_mb`` in bytes (default: twice the largest gradient, one in flight while
        the next waits): each local gradient is let go of once packed, and each packed message once
        it ended, so these are what a rank holds beyond ZeRO-2's own."""
        if config.gradient_budget_mb is None:
            return default_hold([p.numel() * p.element_size() for p in params])
        return None if math.isinf(config.gradient_budget_mb) else _bytes(config.gradient_budget_mb)

    def layout(self) -> Any:
        shards = self.shards
        return lambda plan: ShardedLayout(shards)

    def stepping(self, exchange: Exchange, handover: Handover, updates: DeferredUpdates, topology: Topology,
                 config: RuntimeConfig) -> ShardedStep:
        return ShardedStep(self.shards, exchange, partial(getattr, topology, "data"), handover, updates,
                           config.timeout)



class FullySharded(Sharded):
    """Sharded, and each module's parameters whole only around its forward and backward passes
    (:mod:`gradsched.runtime.architectures.sharded.full`)."""

    name = "fully_sharded"
    gathers_parameters = True
    separate_shards = True

    def __init__(self) -> None:
        super().__init__()
        self.gatherer: Gatherer | None = None  # made by the stepping's attach (the reduce-scatters wait behind it)

    def refusals(self, params: Sequence[torch.Tensor], config: RuntimeConfig, backend: str) -> list[str]:
        refused = super().refusals(params, config, backend)
        storages = [p.untyped_storage() for p in params]
        own = all(s.nbytes() == p.numel() * p.element_size() for s, p in zip(storages, params)) and \
            len({s.data_ptr() for s in storages}) == len(params)
        more = [(config.compression is not None, f"compression={config.compression!r}"),
                (config.find_unused_parameters, "find_unused_parameters=True (its parameters are gathered as each "
                                                "module runs, so every rank must run the same modules in the same "
                                                "order, as under FSDP2: a module unused on some ranks would be "
                                                "gathered by the others alone)"),
                (not own, "parameters that share memory or are views of a larger tensor (each is freed whole "
                          "between uses)")]
        return refused + [f"architecture='fully_sharded' does not support {what} yet; use architecture='sharded'"
                          for failed, what in more if failed]

    def before_reducing(self) -> Callable[[], None]:
        """The gathers go first: a reduce-scatter waits while one is in flight or due."""
        def gathers_first() -> None:
            if self.gatherer is not None:
                self.gatherer.gathers_first()

        return gathers_first

    def stepping(self, exchange: Exchange, handover: Handover, updates: DeferredUpdates, topology: Topology,
                 config: RuntimeConfig) -> FullyShardedStep:
        group = topology.gathers
        pairwise = pairwise_for(group, exchange.device)
        shards = self.shards

        def gatherer(units: Sequence[Sequence[int]]) -> Gatherer:
            budget = None if config.gather_budget_mb is None else _bytes(config.gather_budget_mb)
            self.gatherer = Gatherer(shards, units, budget, pairwise, group, exchange.device, config.timeout)
            return self.gatherer

        return FullyShardedStep(shards, exchange, partial(getattr, topology, "data"), handover, updates,
                                config.timeout, gatherer)
