"""What varies by architecture, as one object chosen once per wrap: the interface, below the
training thread's objects that use it and the architectures that implement it.

An *architecture* is a way of averaging gradients over the ranks: all-reduce among the
workers, parameter servers, sharded (every rank owns 1/n of each parameter and of its
optimizer state), fully sharded, and, after the hand-off, DDP's own C++ reducer. The frontend
builds one from the user's options (:func:`gradsched.runtime.architectures.choice.choose`, the
only place that reads the option's name, from the one list in
:mod:`gradsched.core.architectures`) and hands it in; nothing else asks which one it holds.

The order in which the runtime asks (each step may rely on the ones before it):

1. at the wrap, before any collective: :meth:`Architecture.refusals`,
   :meth:`~Architecture.check_optimizer` (again whenever an optimizer is bound later),
   :attr:`~Architecture.comm_hook_refusal`;
2. the process groups it needs (:attr:`~Architecture.servers`,
   :attr:`~Architecture.hands_out_dtensors`, :attr:`~Architecture.gathers_parameters`), made
   by the topology; on a server rank :meth:`~Architecture.serve`, and nothing more;
3. on a worker, :meth:`~Architecture.open` with the run's record
   (:class:`~gradsched.runtime.training.run.Run`): the *backend* that reduces. On gradsched's
   data plane (:class:`~gradsched.runtime.architectures.on_plane.OnDataPlane`, the default of
   every architecture a user names) the plane then asks, in this order:
   :meth:`~Architecture.specs` (what the scheduler plans over; an architecture may keep what it
   learns here for the calls after), :meth:`~Architecture.hold_bytes`,
   :meth:`~Architecture.link_model`, :meth:`~Architecture.layout`,
   :meth:`~Architecture.transport`, :meth:`~Architecture.stepping` (a :class:`Stepping`, whose
   hooks go on after the plane's own), :attr:`~Architecture.buffers_on_data_plane`;
4. while training: :attr:`~Architecture.join_refusal` when ``join()`` is entered, and at the
   hand-off point after the measured trial kept DDP-style buckets,
   :meth:`~Architecture.handed_off`: the architecture that reduces from then on (the hand-off
   swaps the object; the run's record stays).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, Sequence

import torch
from torch import nn
from torch.distributed.algorithms.join import Joinable

from gradsched.core.gathers import GatherModel
from gradsched.core.plan import Plan
from gradsched.core.task import TensorSpec
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.comm.transport import Transport
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.device import Device
from gradsched.runtime.planning.link_model import LinkModel
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.join import Iteration
from gradsched.runtime.training.run import CommHook, Run
from gradsched.runtime.training.updates import DeferredUpdates, Snapshot
from gradsched.runtime.training.waits import ModuleWaits


class Stepping(Protocol):
    """The training thread's side of an architecture on gradsched's data plane: what
    ``step()``, a module's forward pass, ``synchronize()``, clipping and the optimizer's
    checkpoint do with the reduced gradients."""

    def attach(self, params: Sequence[torch.Tensor], waits: ModuleWaits) -> list[Any]:
        """Hooks of its own on the parameters and on the modules of ``waits`` (the Dependency
        Proxy's map: :class:`~gradsched.runtime.training.waits.ModuleWaits`); their handles,
        removed with the plane's. Registered after the plane's own."""

    def close(self, wait: bool) -> None:
        """The plane closes (its hooks removed): leave the parameters as the model holds them
        without this architecture; with ``wait`` every rank closes alike (collectives allowed)."""

    def step(self, snapshot: Snapshot, plan: Plan, reduced: bool) -> None:
        """``optimizer.step()`` after the round's backward pass closed (``plan``: its plan;
        ``reduced``: a backward pass communicated since the previous step, on every rank alike)."""

    def local_gradient(self, i: int) -> None:
        """A backward pass that does not communicate (``no_sync()``) added to parameter ``i``'s gradient."""

    def accumulated(self, i: int) -> None:
        """A later backward pass over the round's forward pass (``retain_graph``) added a local
        gradient to parameter ``i``'s, handed over already: under DDP it adds to the average."""

    def before_forward(self, indices: Sequence[int], what: str) -> bool:
        """The forward pass of a module owning parameters ``indices`` is about to run: wait for
        what it reads (the Dependency Proxy). Whether it had to wait for anything."""

    def synchronize(self) -> None:
        """What must be waited for beyond the reductions and pending updates the plane settles
        first (sharded: the parameters' all-gathers)."""

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        """``clip_grad_norm_`` over the averaged gradients."""

    def clip_value(self, value: float) -> None:
        """``clip_grad_value_`` over the averaged gradients."""

    def full_state_dict(self, rank0_only: bool) -> dict:
        """The optimizer's ``state_dict()`` as the same optimizer holds it without this architecture
        (called once everything is synchronized; where it must be joined, on rank 0 only with
        ``rank0_only``)."""

    def state_saved(self, state_dict: dict) -> None:
        """The optimizer's ``state_dict()`` was just made: mark what only this rank can load."""

    def state_loading(self, state_dict: dict) -> None:
        """``load_state_dict(state_dict)`` is about to run: refuse (a ``GradschedError`` saying what
        to do) a state this rank cannot use; take off the marks of :meth:`state_saved`."""

    def gather_model(self) -> GatherModel | None:
        """What shares the link with the gradients' messages in the backward pass, for the plans
        (:func:`gradsched.sim.make_plan`'s ``gathers``): fully sharded's parameter all-gathers,
        as its queue issues them; None where nothing does."""


class Backend(Protocol):
    """What reduces for the coordinator (:meth:`Architecture.open`): gradsched's data plane, or
    DDP's reducer after the hand-off. It borrows the run's record and holds only what dies
    with it; the coordinator calls nothing else, and asks nothing of which it holds."""

    @property
    def uneven(self) -> Joinable:
        """The Joinable of ``join()``."""

    @property
    def joined(self) -> bool:
        """This rank has joined (``join()``) and shadows the others."""

    def attach(self) -> None: ...
    def step(self) -> None: ...
    def synchronize(self) -> None: ...
    def set_sync(self, enabled: bool) -> None: ...
    def forward_param_sync(self, enabled: bool | None = None) -> bool: ...
    def control_point(self, round_index: int) -> None: ...
    def shadow(self, iteration: Iteration) -> None: ...
    def broadcast_buffers(self, source: int) -> None: ...
    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor: ...
    def clip_value(self, value: float) -> None: ...
    def full_state_dict(self, rank0_only: bool) -> dict: ...
    def state_saved(self, state_dict: dict) -> None: ...
    def state_loading(self, state_dict: dict) -> None: ...
    def idle(self) -> bool: ...

    def opened_in_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """What its own forward pre-hook would have done for the forward pass that is starting
        (it was opened in that pass's first pre-hook, after its own hooks were chosen)."""

    def retire(self) -> None:
        """Hand over to the next backend (every reduction complete): hooks off, threads stopped,
        memory of its own let go; what it measured is in the run's record already."""

    def close(self, wait: bool) -> None:
        """Detach; with ``wait``, first finish the communication in flight."""

    def stop(self, wait: bool) -> None:
        """Stop the threads and let go of the groups (after :meth:`close`)."""


class Architecture:
    """The interface, with what every architecture on gradsched's data plane shares as defaults."""

    name: ClassVar[str]  # as the user names it: architecture=...
    hands_out_dtensors: ClassVar[bool] = False  # .grad is a DTensor: a process group for torch's collectives on it
    gathers_parameters: ClassVar[bool] = False  # parameters freed between uses: a process group for their gathers
    buffers_on_data_plane: ClassVar[bool] = True  # buffers broadcast on the user's backend (the "broadcasts"
    #   group, issued by the launcher); else at once on the workers' gloo group ("buffers")
    comm_hook_refusal: ClassVar[str | None] = None  # why a DDP communication hook cannot run (None: it can)
    join_refusal: ClassVar[str | None] = None  # why join() (uneven inputs) cannot run (None: it can)
    servers: int = 0  # ranks that serve rather than train: the last ``servers`` of the group

    def __repr__(self) -> str:
        return f"architecture={self.name!r}"

    # -- refusals, at the wrap, before any collective ------------------------------------------
    def refusals(self, params: Sequence[torch.Tensor], config: RuntimeConfig, backend: str) -> list[str]:
        """What this architecture cannot do for these parameters, options and backend, each in words."""
        return []

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise if ``optimizer`` cannot be applied here (at the wrap, and when one is bound later)."""

    # -- the data plane ------------------------------------------------------------------------
    def specs(self, names: Sequence[str], params: Sequence[torch.Tensor], topology: Topology,
              config: RuntimeConfig, comm_hook: CommHook | None) -> list[TensorSpec]:
        """What the scheduler plans over."""
        raise NotImplementedError

    def transport(self, topology: Topology, names: Sequence[str], params: Sequence[torch.Tensor],
                  versions: PlanVersions, config: RuntimeConfig, device: Device,
                  comm_hook: CommHook | None) -> Transport:
        """How one message's buffers are averaged (its sends issued through ``device``)."""
        raise NotImplementedError

    def hold_bytes(self, params: Sequence[torch.Tensor], config: RuntimeConfig) -> int | None:
        """The most bytes of handed-over gradients a rank holds before its backward pass waits for
        the launcher (None: no bound; the gradients live in the plan's buffers anyway)."""
        return None

    def layout(self) -> Callable[[Plan], Any] | None:
        """Where a plan's messages travel from (None: the default, flat buffers the gradients live in)."""
        return None

    def stepping(self, exchange: Exchange, handover: Handover, updates: DeferredUpdates, topology: Topology,
                 config: RuntimeConfig) -> Stepping:
        """The training thread's side (:class:`Stepping`)."""
        raise NotImplementedError

    def link_model(self) -> LinkModel:
        """How plans (the simulator) model a message's link, and whether the measured trial is
        predicted on a probed link."""
        return LinkModel()

    # -- the coordinator's backend -------------------------------------------------------------
    def open(self, run: Run) -> Backend:
        """What reduces for ``run`` under this architecture: gradsched's data plane (every
        architecture a user names: :class:`~gradsched.runtime.architectures.on_plane.OnDataPlane`)
        or DDP's reducer after the hand-off."""
        raise NotImplementedError

    # -- roles and the hand-off --------------------------------------------------------------
    def serve(self, model: nn.Module, names: Sequence[str], params: Sequence[torch.Tensor],
              config: RuntimeConfig, topology: Topology) -> None:
        """A server rank's whole part: serve until the workers are done, then return."""
        raise NotImplementedError(f"{self!r} has no server ranks")

    def handed_off(self, config: RuntimeConfig, workers: int) -> Architecture | None:
        """The architecture to reduce with once the measured trial kept DDP-style buckets
        (None: stay, with the buckets, on gradsched's data plane)."""
        return None
