"""Uneven inputs: a rank that runs out of batches shadows the others until every rank is done.

gradsched takes part in PyTorch's generic join context manager
(:class:`torch.distributed.algorithms.Join`), with DDP's semantics::

    with model.join():            # gradsched.DistributedDataParallel; or Join([model])
        for x, y in loader:       # ranks may have different numbers of batches
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

(``with optimizer.join():`` or ``Join([optimizer])`` for a model wrapped with
:func:`gradsched.wrap`). Inside the context:

* before each forward pass, a rank still training tells the others so (Join's own
  all-reduce), and then which ranks are still training and whether the backward pass
  after this forward pass communicates (one more all-reduce, on gradsched's control group);
* a rank that has left the loop (*joined*) shadows each iteration of the others: the
  buffers' broadcast and, for a backward pass that communicates, a round of zero gradients
  through the very plan the others follow (its messages, credit, parameter servers and
  control points), with no update of its own;
* gradients are averaged over the initial number of workers (a joined rank adds zeros), or,
  with ``divide_by_initial_world_size=False``, over the ranks still training;
* buffers come from the highest rank still training (rank 0 may have joined);
* once every rank has joined, every rank gets the parameters and buffers of the highest rank
  among the last to join, so the ranks leave the context equal. Optimizer state is each
  rank's own, as with DDP (a joined rank did not step).

Inside the context, as with DDP, each forward pass with gradients enabled and outside
``no_sync()`` must be followed by ``backward()`` (evaluate under ``torch.no_grad()``); a rank
that breaks this gets a :class:`GradschedError`. An optimizer is optional, as with DDP. Inside
the context a round's control point (:mod:`gradsched.runtime.planning.planner`) is held when the next
iteration is announced (or, on a rank that has joined, before it shadows the next one), not in
``step()``, so that every rank holds it at the same point whether it steps or not.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, JoinHook, Joinable

from gradsched.runtime.errors import GradschedError, failing_rank
from gradsched.runtime.training.run import Run


class Iteration(NamedTuple):
    """What every rank knows about one iteration of the ranks still training."""

    training: int  # how many ranks are still training
    source: int  # the highest of them: the source of buffers
    communicates: bool  # the backward pass after this forward pass communicates


class Joining(Protocol):
    """What join asks of the backend that reduces a wrapped model's rounds (gradsched's plane)."""

    def control_point(self, round_index: int) -> None:
        """Hold the control point after round ``round_index`` (every rank, at the same point)."""

    def synchronize(self) -> None:
        """Finish every reduction and update in flight."""

    def shadow(self, iteration: Iteration) -> None:
        """Take part in one iteration of the ranks still training, with zero gradients."""

    def broadcast_model(self, source: int) -> None:
        """Copy rank ``source``'s parameters (and synced buffers) to every worker."""


class UnevenInputs(Joinable):
    """The :class:`~torch.distributed.algorithms.Joinable` of one backend (``joining``, which
    holds this: :meth:`release` when it stops) over the run ``run`` (whether this rank has
    joined is kept in its rounds, which the ranks' progress reports); ``refusal``: why the
    architecture cannot run ``join()``, None where it can."""

    def __init__(self, joining: Joining, run: Run, refusal: str | None) -> None:
        super().__init__()
        self._joining: Joining | None = joining
        self.run, self.refusal = run, refusal
        self.divide_by_initial_world_size = True
        self.announced: tuple[int, bool] | None = None  # (round, communicates) of the latest forward pass

    @property
    def joined(self) -> bool:
        """This rank left the loop and shadows the others."""
        return self.run.life.joined

    @joined.setter
    def joined(self, value: bool) -> None:
        self.run.life.joined = value

    @property
    def backend(self) -> Joining:
        if self._joining is None:
            raise GradschedError("gradsched join: the wrapped model was closed (or handed to DDP's reducer, "
                                 "whose join() is DDP's own)")
        return self._joining

    def release(self) -> None:
        """The backend stopped: let go of it (it holds this)."""
        self._joining = None

    # -- the Joinable interface --------------------------------------------------------------
    def join_hook(self, **kwargs: Any) -> JoinHook:
        unknown = sorted(set(kwargs) - {"divide_by_initial_world_size"})
        if unknown:
            raise TypeError(f"gradsched join: unexpected keyword arguments {unknown}; "
                            "the one option is divide_by_initial_world_size")
        if self.refusal is not None:
            raise GradschedError(f"gradsched join: {self.refusal}")
        self.divide_by_initial_world_size = bool(kwargs.get("divide_by_initial_world_size", True))
        self.joined = False
        self.announced = None
        return _Shadow(self)

    @property
    def join_device(self) -> torch.device:
        return torch.device("cpu")  # the control group is gloo

    @property
    def join_process_group(self) -> Any:
        return self.run.topology.control

    # -- a rank still training --------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self._join_config.enable

    def announce(self, round_index: int, communicates: bool) -> Iteration:
        """Before a forward pass inside the context (the latest backward pass was
        ``round_index``): check the previous iteration was whole, and tell the joined ranks
        what this one does."""
        if self.announced is not None and self.announced[1] and round_index == self.announced[0]:
            raise GradschedError(
                "gradsched join: a forward pass with gradients enabled ran no backward pass before the next "
                "forward pass; inside join() the ranks that have joined shadow that backward pass: run "
                "evaluation under torch.no_grad(), and call backward() after every other forward pass"
            )
        work = Join.notify_join_context(self)  # raises if throw_on_early_termination and a rank joined
        co = self.backend
        co.control_point(round_index)  # inside the context, here: where the joined ranks hold theirs
        iteration = self.agree(communicates)
        if work is not None:
            work.wait()
        self.announced = (round_index, iteration.communicates)
        return iteration

    def grad_scale(self, iteration: Iteration) -> float | None:
        """The factor that turns the average over every worker into the average over the
        ranks still training (``divide_by_initial_world_size=False``), or None."""
        workers = self.run.world_size
        if self.divide_by_initial_world_size or iteration.training == workers:
            return None
        return workers / iteration.training

    # -- every rank ---------------------------------------------------------------------------
    def agree(self, communicates: bool | None) -> Iteration:
        """One all-reduce on the control group: which ranks are still training (``None`` for
        a joined rank), and whether their next backward pass communicates."""
        run = self.run
        workers = run.world_size
        state = torch.zeros(workers + 1, dtype=torch.float64)
        if communicates is not None:
            state[run.rank] = 1.0
            state[workers] = float(communicates)
        with failing_rank("agreeing on the ranks still training (join)", run.explain):
            dist.all_reduce(state, group=self.join_process_group)
        training = [r for r in range(workers) if state[r] > 0]
        talking = round(state[workers].item())
        if not training:
            raise GradschedError("gradsched join: no rank is training, yet a joined rank was asked to shadow one")
        if talking not in (0, len(training)):
            raise GradschedError(
                f"gradsched join: {talking} of the {len(training)} ranks still training run a backward pass that "
                "communicates after this forward pass and the others do not: use no_sync() and torch.no_grad() "
                "alike on every rank"
            )
        return Iteration(len(training), max(training), talking > 0)

    def disable(self) -> None:
        """Every rank left the context: forward passes stop announcing themselves."""
        self._join_config = self._join_config._replace(enable=False)
        self.announced = None


class _Shadow(JoinHook):
    def __init__(self, uneven: UnevenInputs) -> None:
        self.uneven = uneven

    def main_hook(self) -> None:
        """One iteration of the ranks still training, shadowed by a rank that has joined."""
        uneven = self.uneven
        co = uneven.backend
        co.control_point(uneven.run.life.index)  # of the latest round: where the ranks training hold theirs
        if not uneven.joined:
            co.synchronize()  # this rank's own last updates
            uneven.joined = True
        co.shadow(uneven.agree(None))

    def post_hook(self, is_last_joiner: bool) -> None:
        """Every rank has joined: copy the last joiners' parameters and buffers everywhere."""
        co = self.uneven.backend
        try:
            co.synchronize()
            run = self.uneven.run
            source = torch.tensor([run.rank if is_last_joiner else -1], dtype=torch.float64)
            with failing_rank("finding the last rank to join (join)", run.explain):
                dist.all_reduce(source, op=dist.ReduceOp.MAX, group=self.uneven.join_process_group)
            co.broadcast_model(int(source.item()))
        finally:
            self.uneven.joined = False
            self.uneven.disable()


class JoinsUnevenInputs(Joinable):
    """``join()`` for the objects users hold (``gradsched.DistributedDataParallel``, the
    optimizer :func:`gradsched.wrap` returns), each a :class:`Joinable` in its own right
    (``Join([model])``), backed by its coordinator's :class:`UnevenInputs`."""

    def _uneven_inputs(self) -> UnevenInputs:
        raise NotImplementedError

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """A context manager in which ranks may run different numbers of iterations
        (DDP's ``join()``; see :mod:`gradsched.runtime.training.join`).

        Args:
            divide_by_initial_world_size: average gradients over every worker, a rank that
                has joined adding zeros (default, as DDP); False: over the ranks still training.
            enable: False turns the context into a no-op (the inputs are known to be even).
            throw_on_early_termination: every rank raises as soon as one runs out of inputs.
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return self._uneven_inputs().join_hook(**kwargs)

    @property
    def join_device(self) -> torch.device:
        return self._uneven_inputs().join_device

    @property
    def join_process_group(self) -> Any:
        return self._uneven_inputs().join_process_group

    @property
    def _join_config(self) -> Any:  # set by Join on the object the user passed; read by the coordinator
        return self._uneven_inputs()._join_config

    @_join_config.setter
    def _join_config(self, value: Any) -> None:
        self._uneven_inputs()._join_config = value
