"""The communication side of one wrapped model, built in one place for the plane: what its
gradients travel as (the specs the scheduler plans over), through which transport, in which
exchange, on the run's device. What differs by architecture (specs, transport, layout, the link
plans model) the architecture says (:class:`gradsched.runtime.training.architecture.Architecture`),
asked in the order its docstring gives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gradsched.core.task import TensorSpec
from gradsched.core.engine import message_hold
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.planning.planner import initial_plan
from gradsched.runtime.planning.prediction import ddp_buckets
from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.training.run import Run


@dataclass
class DataPlane:
    tensors: list[TensorSpec]  # what the plans are made over
    exchange: Exchange


def open_data_plane(architecture: Architecture, run: Run, on_event: Callable[..., None] | None) -> DataPlane:
    """Build it; the exchange's launcher thread runs once this returns (close the exchange). The
    plans it adopts and the link estimate it fits are the run's (``run.measured``)."""
    names, params, config = run.names, run.params, run.config
    tensors = architecture.specs(names, params, run.topology, config, run.comm_hook)
    hold_bytes = architecture.hold_bytes(params, config)
    sim = architecture.link_model().sim
    versions = PlanVersions(initial_plan(tensors, run.policy, sim, message_hold(hold_bytes)))
    layout = architecture.layout()
    # over the gradients' homes (no layout of the architecture's own): laid out as DDP's buckets,
    # so that the measured trial's buckets and the hand-off to DDP's reducer reduce in place
    homes_plan = None if layout is not None else initial_plan(
        tensors, ddp_buckets(tensors, sum(p.numel() * p.element_size() for p in params), config), sim, None)
    transport = architecture.transport(run.topology, names, params, versions, config, run.device, run.comm_hook)
    exchange = Exchange(tensors, params, versions, transport, run.device, config.timeout, on_event, layout,
                        chunk_bytes=int(config.bucket_cap_mb * 2**20), hold_bytes=hold_bytes, homes_plan=homes_plan,
                        estimator=run.measured.estimator)
    exchange.explain = run.explain
    run.measured.adopt(versions.plan_for(1), 1)
    return DataPlane(list(tensors), exchange)
