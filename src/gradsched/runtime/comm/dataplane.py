"""The communication side of one wrapped model, built in one place: what its gradients travel
as (the specs the scheduler plans over: whole gradients, or shards under
``architecture="sharded"``), on which device work on them is ordered
(:mod:`gradsched.runtime.device`), through which transport, in which exchange."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from gradsched.core.base import PolicyConfig
from gradsched.core.task import TensorSpec
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.plans import PlanVersions, tensor_specs
from gradsched.runtime.comm.sharded import ShardedLayout, Shards
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transports import make_transport, travelling_dtype
from gradsched.runtime.config import Environment, RuntimeConfig
from gradsched.runtime.device import Device, device_for
from gradsched.runtime.planning.planner import initial_plan


@dataclass
class DataPlane:
    tensors: list[TensorSpec]  # what the plans are made over
    shards: Shards | None  # this rank's shards (sharded), or None
    device: Device
    exchange: Exchange


def open_data_plane(names: Sequence[str], params: Sequence[torch.Tensor], policy: PolicyConfig,
                    config: RuntimeConfig, topology: Topology, comm_hook: tuple[Any, Callable] | None,
                    on_event: Callable[..., None] | None, explain: Callable[[], str]) -> DataPlane:
    """Build it; the exchange's launcher thread runs once this returns (close the exchange)."""
    shards = None
    if config.architecture == "sharded":  # plans over shards (gradsched.runtime.comm.sharded)
        shards = Shards(names, params, topology.rank, topology.num_workers, config.compression)
    tensors = shards.specs() if shards is not None else tensor_specs(
        names, params, travelling_dtype(config.compression, comm_hook))
    versions = PlanVersions(initial_plan(tensors, policy, config.plan_architecture))
    device = device_for(params, Environment.read(), config.timeout)
    try:
        transport = make_transport(topology, names, params, versions, config.compression, device, comm_hook, shards)
        exchange = Exchange(tensors, params, versions, transport, device, config.timeout, on_event,
                            (lambda plan: ShardedLayout(shards)) if shards is not None else None)
    except BaseException:
        device.close()
        raise
    exchange.explain = explain
    return DataPlane(list(tensors), shards, device, exchange)
