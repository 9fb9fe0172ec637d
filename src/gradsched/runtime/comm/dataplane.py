"""The communication side of one wrapped model, built in one place: what its gradients travel
as (the specs the scheduler plans over), on which device work on them is ordered
(:mod:`gradsched.runtime.device`), through which transport, in which exchange. What differs by
architecture (specs, transport, layout, the link plans model) the architecture says
(:class:`gradsched.runtime.architectures.base.Architecture`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from gradsched.core.base import PolicyConfig
from gradsched.core.task import TensorSpec
from gradsched.runtime.architectures.base import Architecture
from gradsched.runtime.comm.exchange import Exchange, message_hold
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.config import Environment, RuntimeConfig
from gradsched.runtime.device import Device, device_for
from gradsched.runtime.planning.planner import initial_plan
from gradsched.runtime.planning.prediction import ddp_buckets


@dataclass
class DataPlane:
    tensors: list[TensorSpec]  # what the plans are made over
    device: Device
    exchange: Exchange


def open_data_plane(architecture: Architecture, names: Sequence[str], params: Sequence[torch.Tensor],
                    policy: PolicyConfig, config: RuntimeConfig, topology: Topology,
                    comm_hook: tuple[Any, Callable] | None, on_event: Callable[..., None] | None,
                    explain: Callable[[], str]) -> DataPlane:
    """Build it; the exchange's launcher thread runs once this returns (close the exchange)."""
    tensors = architecture.specs(names, params, topology, config, comm_hook)
    hold_bytes = architecture.hold_bytes(params, config)
    versions = PlanVersions(initial_plan(tensors, policy, architecture.link_model, message_hold(hold_bytes)))
    layout = architecture.layout()
    # over the gradients' homes (no layout of the architecture's own): laid out as DDP's buckets,
    # so that the measured trial's buckets and the hand-off to DDP's reducer reduce in place
    homes_plan = None if layout is not None else initial_plan(
        tensors, ddp_buckets(tensors, sum(p.numel() * p.element_size() for p in params), config),
        architecture.link_model, None)
    device = device_for(params, Environment.read(), config.timeout)
    try:
        transport = architecture.transport(topology, names, params, versions, config, device, comm_hook)
        exchange = Exchange(tensors, params, versions, transport, device, config.timeout, on_event,
                            layout, chunk_bytes=int(config.bucket_cap_mb * 2**20), hold_bytes=hold_bytes,
                            homes_plan=homes_plan)
    except BaseException:
        device.close()
        raise
    exchange.explain = explain
    return DataPlane(list(tensors), device, exchange)
