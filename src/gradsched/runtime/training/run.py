"""The run's record: what lives as long as one wrap of a model on one rank, made once by the
frontend (:func:`gradsched.runtime.frontend.wrap.start`) and read by every backend that reduces
for it.

A record, not an actor: it holds the wrap's identity (the model, its scheduled parameters and
their names), its options (the policy, the runtime options, DDP's communication hook), its
process groups, the device its gradients live on and the clock that times them, the rounds
(one count for the run, whichever backend reduces them), DDP's sync switches, what scheduling
bought (exposure), the ranks' progress (peers), the trace, the optimizer's applier
(:class:`~gradsched.runtime.training.updates.DeferredUpdates`) and what was measured and decided
(:class:`~gradsched.runtime.planning.measurements.Measurements`: what ``stats()`` and
``export_profile()`` read).

Ownership goes one way: the coordinator holds the record and the backend; a backend (the data
plane, DDP's reducer after the hand-off) borrows the record and holds only what dies with it
(threads, flat buffers, hooks, the plans' machinery); nothing the record holds refers back to a
backend or to the coordinator. So the hand-off retires the plane whole, and what the plane
measured stays readable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gradsched.core.base import PolicyConfig
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.config import Environment, RuntimeConfig
from gradsched.runtime.device import Device, device_for
from gradsched.runtime.diagnostics.exposure import Exposure
from gradsched.runtime.diagnostics.peer_status import PeerStatus
from gradsched.runtime.diagnostics.tracing import RunTrace
from gradsched.runtime.planning.clock import Clock
from gradsched.runtime.planning.measurements import Measurements
from gradsched.runtime.training.lifecycle import RoundLife
from gradsched.runtime.training.syncing import SyncSwitches
from gradsched.runtime.training.updates import DeferredUpdates

CommHook = tuple[Any, Callable]  # (state, hook): a DDP communication hook
Sparse = tuple[Sequence[str], Sequence[nn.Parameter]]  # parameters with sparse gradients, outside the plans


@dataclass(eq=False)
class Run:
    # identity
    model: nn.Module
    names: list[str]  # the scheduled parameters', in forward order
    params: list[nn.Parameter]
    sparse: Sparse  # reduced outside the plans (gradsched.runtime.training.sparse)
    # options
    policy: PolicyConfig
    config: RuntimeConfig
    comm_hook: CommHook | None  # run on every message (its state already on the data group)
    entry: str  # what the user called, for errors raised later
    # where it runs
    topology: Topology  # the process groups
    device: Device  # where the gradients live and how work on them is ordered
    clock: Clock  # the training thread's timestamps (device times on CUDA)
    # what goes on for the whole run
    updates: DeferredUpdates  # the user's optimizer, applied per parameter
    life: RoundLife = field(default_factory=RoundLife)  # the rounds: one counter, whichever backend reduces
    sync: SyncSwitches = field(default_factory=SyncSwitches)  # no_sync() and DDP's require_*_sync
    exposure: Exposure = field(default_factory=Exposure)  # what scheduling bought
    measured: Measurements = field(default_factory=Measurements)  # stats() and export_profile() read it
    trace: RunTrace | None = None
    peers: PeerStatus | None = None  # the ranks' progress, for errors (None: not started yet)
    handoff_due: bool = False  # the measured trial kept DDP-style buckets (outside join()): hand them off
    handed_off_round: int | None = None  # DDP's reducer reduces from this round on
    index: dict[int, int] = field(init=False)  # id(parameter) -> its position

    def __post_init__(self) -> None:
        self.index = {id(p): i for i, p in enumerate(self.params)}

    @classmethod
    def open(cls, model: nn.Module, optimizer: torch.optim.Optimizer | None, names: Sequence[str],
             params: Sequence[nn.Parameter], policy: PolicyConfig, config: RuntimeConfig, topology: Topology,
             sparse: Sparse, comm_hook: CommHook | None, entry: str) -> Run:
        """The record of a wrap about to start (its peers' watcher not yet started: :meth:`watch`)."""
        trace = RunTrace(topology.rank) if config.trace else None
        device = device_for(params, Environment.read(), config.timeout)
        run = cls(model, list(names), list(params), sparse, policy, config, comm_hook, entry, topology, device,
                  Clock(device), DeferredUpdates(optimizer, params, names, trace), trace=trace)
        run.life.active_at = time.monotonic()
        return run

    def watch(self) -> None:
        """Start reporting this rank's progress to the others (a collective on the control group)."""
        self.peers = PeerStatus(self.rank, self.topology.workers, self.life, self.topology.control)

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        """The workers (ranks that train)."""
        return self.topology.num_workers

    def explain(self) -> str:
        """What the other ranks' progress says, for an error ("" before the watcher started)."""
        return self.peers.explain() if self.peers is not None else ""
