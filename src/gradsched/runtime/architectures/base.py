"""What varies by architecture, as one object chosen once per wrap.

An *architecture* is a way of averaging gradients over the ranks: all-reduce among the
workers, parameter servers, sharded (every rank owns 1/n of each parameter and of its
optimizer state), and, after the hand-off, DDP's own C++ reducer. The frontend builds one
from the user's options (:func:`gradsched.runtime.architectures.choice.choose`, the only place
that reads the option's name) and hands it in; nothing else asks which one it holds. It
answers, for the ranks of one wrapped model:

* what it refuses and why, before any collective (:meth:`Architecture.refusals`,
  :meth:`~Architecture.check_optimizer`, :attr:`~Architecture.comm_hook_refusal`,
  :attr:`~Architecture.join_refusal`);
* who takes which role (:attr:`~Architecture.servers`, :meth:`~Architecture.serve`);
* what the scheduler plans over and how a message travels (:meth:`~Architecture.specs`,
  :meth:`~Architecture.transport`, :meth:`~Architecture.layout`), and how plans model the link
  (:attr:`~Architecture.link_model`, :meth:`~Architecture.link`);
* what ``step()``, a module's forward pass and clipping do with the reduced gradients, and who
  owns which memory (:meth:`~Architecture.stepping`: a :class:`Stepping`);
* whether the measured trial can be predicted (:attr:`~Architecture.predicts_trial`) and its
  kept buckets handed to DDP's reducer (:meth:`~Architecture.handed_off`, which returns the
  architecture that reduces from then on: the hand-off swaps the object).

This module is low in the layering: the training thread's objects use the interface, the
modules that implement it (``allreduce``, ``servers``, ``sharded``, ``reducer``) build on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence

import torch

if TYPE_CHECKING:  # types only: the architectures build on these modules, not they on it
    from gradsched.core.task import TensorSpec
    from gradsched.runtime.comm.plans import PlanVersions
    from gradsched.runtime.comm.topology import Topology
    from gradsched.runtime.comm.transport import Transport
    from gradsched.runtime.config import RuntimeConfig
    from gradsched.runtime.device import Device

CommHook = tuple[Any, Callable]  # (state, hook): a DDP communication hook


class Stepping(Protocol):
    """The training thread's side of an architecture on gradsched's data plane: what
    ``step()``, a module's forward pass, ``synchronize()``, clipping and the optimizer's
    checkpoint do with the reduced gradients."""

    def attach(self, params: Sequence[torch.Tensor], waits: Any) -> list[Any]:
        """Hooks of its own on the parameters and on the modules of ``waits`` (the Dependency
        Proxy's map: :class:`~gradsched.runtime.training.waits.ModuleWaits`); their handles,
        removed with the plane's. Registered after the plane's own."""

    def close(self, wait: bool) -> None:
        """The plane closes (its hooks removed): leave the parameters as the model holds them
        without this architecture; with ``wait`` every rank closes alike (collectives allowed)."""

    def step(self, snapshot: Any, plan: Any) -> None:
        """``optimizer.step()`` after the round's backward pass closed (``plan``: its plan)."""

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

    def full_state_dict(self) -> dict:
        """The optimizer's ``state_dict()`` as the same optimizer holds it without this architecture
        (called once everything is synchronized)."""


class Backend(Protocol):
    """What reduces for a coordinator (:meth:`Architecture.open`): gradsched's data plane, or
    DDP's reducer after the hand-off. The coordinator calls nothing else, and asks nothing of
    which it holds."""

    updates: Any  # the user's optimizer, applied per parameter (DeferredUpdates)
    planner: Any  # the plans, the trial and what they measured (after the hand-off: as they ended)
    exchange: Any  # the data plane's messages and link estimate (as above)
    tensors: Any  # what the plans are made over
    waits: Any  # the Dependency Proxy's map of modules to parameters
    uneven: Any  # the Joinable of join()
    joined: bool  # this rank has joined (join()) and shadows the others

    def attach(self) -> None: ...
    def step(self) -> None: ...
    def synchronize(self) -> None: ...
    def set_sync(self, enabled: bool) -> None: ...
    def forward_param_sync(self, enabled: bool | None = None) -> bool: ...
    def shadow(self, iteration: Any) -> None: ...
    def broadcast_buffers(self, source: int) -> None: ...
    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor: ...
    def clip_value(self, value: float) -> None: ...
    def full_state_dict(self) -> dict: ...
    def idle(self) -> bool: ...

    def opened_in_forward(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """What its own forward pre-hook would have done for the forward pass that is starting
        (it was opened in that pass's first pre-hook, after its own hooks were chosen)."""

    def close(self, wait: bool) -> None:
        """Detach; with ``wait``, first finish the communication in flight."""

    def stop(self, wait: bool) -> None:
        """Stop the threads and let go of the groups (after :meth:`close`)."""


class Architecture:
    """The interface, with what every architecture on gradsched's data plane shares as defaults."""

    name: ClassVar[str]  # as the user names it: architecture=...
    link_model: ClassVar[str] = "allreduce"  # what plans (the simulator) model a message's link as
    predicts_trial: ClassVar[bool] = False  # the simulator predicts the measured trial (the link is probed)
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

    def layout(self) -> Callable[[Any], Any] | None:
        """Where a plan's messages travel from (None: the default, flat buffers the gradients live in)."""
        return None

    def stepping(self, exchange: Any, handover: Any, updates: Any, topology: Topology,
                 config: RuntimeConfig) -> Stepping:
        """The training thread's side (:class:`Stepping`)."""
        raise NotImplementedError

    def link(self, latency: float, seconds_per_byte: float, per_message: float) -> tuple[float, float, float]:
        """The link the simulator plans on, from the estimate of the messages timed so far."""
        return latency, seconds_per_byte, per_message

    # -- the coordinator's backend -------------------------------------------------------------
    def open(self, co: Any) -> Any:
        """What reduces for the coordinator ``co`` under this architecture: gradsched's data plane
        (:class:`~gradsched.runtime.training.plane.Plane`) or DDP's reducer after the hand-off."""
        raise NotImplementedError

    # -- roles and the hand-off --------------------------------------------------------------
    def serve(self, model: torch.nn.Module, names: Sequence[str], params: Sequence[torch.Tensor],
              config: RuntimeConfig, topology: Topology) -> None:
        """A server rank's whole part: serve until the workers are done, then return."""
        raise NotImplementedError(f"{self!r} has no server ranks")

    def handed_off(self, config: RuntimeConfig, workers: int) -> Architecture | None:
        """The architecture to reduce with once the measured trial kept DDP-style buckets
        (None: stay, with the buckets, on gradsched's data plane)."""
        return None
