"""Fully sharded data parallelism (``architecture="fully_sharded"``, ZeRO-3): sharded as
``architecture="sharded"`` is (gradients reduce-scattered by the data plane's scheduled messages,
the optimizer on this rank's shards), and the parameters too: between uses each rank holds
only its shard of every parameter.

A *unit* is one module's own parameters (the modules of the Dependency Proxy's map). Before a
unit's module runs forward, and again before its backward pass, its parameters are gathered
whole into their own memory; after its forward pass they are freed unless the budget keeps them
for the backward pass, and once the backward pass has computed all of their gradients (before
they are accumulated and handed over for their reduce-scatter) they are freed. Which gathers
are issued, in what order and when is :class:`gradsched.core.gathers.GatherQueue`'s:
prefetching ahead of need within ``gather_budget_mb`` of whole parameters alive at once
(default: the largest unit, FSDP2's on a host), on a process group of its own (``gathers``),
from one thread (:class:`Gatherer`), and ahead of the reduce-scatters: one waits to start
while a gather is in flight or due, and the plans of the reduce-scatters are made with the
backward pass's gathers on the link (:meth:`FullyShardedStep.gather_model`).

The parameters stay the model's own ``nn.Parameter`` objects: while freed their data is a
single NaN seen in every place (no memory; autograd's saved tensors are the same objects and
see the data gathered for the backward pass), so they must not be read outside the model's
forward and backward passes; ``close()`` leaves every one whole. ``.grad`` is this rank's shard of
the averaged gradient (a DTensor), as under ``"sharded"``, so torch's own clipping works, and
``model.state_dict()`` gives each parameter as this rank's shard (a DTensor, as FSDP2 does:
no collective; ``full_tensor()`` on every rank joins it); ``load_state_dict()`` takes those or
whole tensors.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradsched.core.gathers import GatherModel, GatherQueue, UnitState, default_budget
from gradsched.core.plan import Plan
from gradsched.runtime.architectures.sharded.shards import Gathered, Shards
from gradsched.runtime.architectures.sharded.stepping import ShardedStep
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.pairwise import Pairwise
from gradsched.runtime.device import Device
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.training.hooks import Hook
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.training.waits import ModuleWaits
from gradsched.runtime.training.updates import DeferredUpdates

MiB = 1 << 20


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


class Gatherer:
    """The thread that issues the parameters' all-gathers, in the queue's order, when the queue
    allows; the training thread queues, needs and frees units (:class:`GatherQueue`, under one
    lock)."""

    def __init__(self, shards: Shards, units: Sequence[Sequence[int]], budget: int | None, pairwise: Pairwise | None,
                 group: dist.ProcessGroup, device: Device, timeout_s: float) -> None:
        """``budget``: bytes of whole parameters prefetching may hold (None: :func:`default_budget`)."""
        self.shards, self.units = shards, [list(u) for u in units]
        sizes = [sum(_nbytes(shards.params[i]) for i in u) for u in self.units]
        self.queue = GatherQueue(sizes, budget or default_budget(sizes))
        self.pairwise, self.group, self.device = pairwise, group, device
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = False
        self.peak = 0  # the most bytes of whole parameters alive at once (tests, the bench)
        self._gathered: dict[int, Gathered] = {}  # unit -> its latest gather (what a reader orders itself after)
        self._asked: Any = None  # the training thread's stream when it last queued or needed a unit (an event)
        #: parameter -> the memory it is gathered into, allocated at its first gather and kept (as
        #: FSDP2 keeps its unsharded parameters' storage): freeing resizes it to nothing, so what
        #: autograd saved of it (a transposed view of a weight) pins no memory, and sees the
        #: values gathered again for the backward pass
        self._storage: dict[int, torch.UntypedStorage] = {}
        self._thread = threading.Thread(target=self._run, name="gradsched-gatherer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the training thread's side -------------------------------------------------------------
    def want(self, units: Sequence[int]) -> None:
        with self.cond:
            self._asked = self.device.record()
            if self.queue.want(units):
                self.cond.notify_all()

    def wait_whole(self, units: Sequence[int], what: str) -> None:
        """Block until every unit of ``units`` is whole (gathered at once if not under way), and
        order this thread after their gathers (on NCCL a gather is done once queued)."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            self._asked = self.device.record()
            if any([self.queue.need(u) for u in units]):
                self.cond.notify_all()
            self._wait_until(lambda: all(self.queue.state[u] is UnitState.READY for u in units), deadline,
                             f"the all-gather of {what}: another rank is stuck or runs another forward or backward "
                             "pass")
            gathered = [self._gathered[u] for u in units]
        for gather in gathered:
            gather.wait(max(0.0, deadline - time.monotonic()), what)

    def settle(self, what: str) -> None:
        """Issue everything queued, wait until it has landed, and order this thread after it."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            self._asked = self.device.record()
            self.queue.force_all()
            self.cond.notify_all()
            self._wait_until(self.queue.settled, deadline, f"the all-gathers of {what}: another rank is stuck")
            gathered = [self._gathered[u] for u in self.queue.whole()]
        for gather in gathered:
            gather.wait(max(0.0, deadline - time.monotonic()), what)

    def gathers_first(self) -> None:
        """Block the calling thread (the one starting a reduce-scatter) while the link is the
        gathers' (:meth:`GatherQueue.holds_reductions`): a gather in flight, or one due now."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            self._wait_until(lambda: self.stopping or not self.queue.holds_reductions(), deadline,
                             "the all-gathers a reduce-scatter waits behind: another rank is stuck")

    def _wait_until(self, done: Callable[[], bool], deadline: float, waiting_for: str) -> None:
        """Under the lock: wait until ``done()`` (raises if a gather failed, or at ``deadline``)."""
        while self.error is None and not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise GradschedError(f"timed out after {self.timeout_s:.0f} s waiting for {waiting_for}")
            self.cond.wait(left)
        self._raise()

    def free(self, u: int) -> None:
        """Unit ``u``'s parameters are not needed whole until gathered again: their memory goes
        (each parameter's data becomes one NaN seen in every place: read between uses, it
        shows, where memory with no bytes behind it would crash the process)."""
        with self.cond:
            if not self.queue.free(u):
                return
            self.release(u)
            self.cond.notify_all()  # room in the budget

    def release(self, u: int) -> None:
        """Unit ``u``'s parameters' memory goes (whatever the queue says: at the start, all, and the
        model's own memory is let go of, not resized: the user may hold a view of it)."""
        for i in self.units[u]:
            p = self.shards.params[i]
            storage = self._storage.get(i)
            if storage is not None and storage.nbytes():  # used by this thread's stream (gathered on another)
                self.device.used_here(p.data)
            p.data = torch.full((1,) * p.dim(), float("nan"), dtype=p.dtype, device=p.device).expand(p.shape)
            if storage is not None:
                storage.resize_(0)

    def _whole(self, i: int) -> torch.Tensor:
        """Parameter ``i``'s whole memory for a gather: its storage grown back (see ``_storage``)."""
        p = self.shards.params[i]
        storage = self._storage.get(i)
        if storage is None:
            whole = torch.empty(p.shape, dtype=p.dtype, device=p.device)
            self._storage[i] = whole.untyped_storage()
            return whole
        storage.resize_(p.numel() * p.element_size())
        return torch.empty(0, dtype=p.dtype, device=p.device).set_(storage, 0, p.shape)

    def free_all(self) -> None:
        for u in self.queue.whole():
            self.free(u)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5.0)

    def _raise(self) -> None:
        if self.error is not None:
            raise GradschedError(f"an all-gather of parameters failed: {self.error}") from self.error

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with self.device.own_stream("gatherer"):
                while True:
                    with self.cond:
                        while not self.stopping and not self.queue.issuable():
                            self.cond.wait()
                        if self.stopping:
                            return
                        u = self.queue.issue()
                        self.peak = max(self.peak, self.queue.materialized)
                        after = self._asked
                    self.device.wait_for([after])  # the shards as the training thread's stream left them
                    for i in self.units[u]:  # the same tensor (autograd may have saved it), its memory back
                        self.shards.params[i].data = self._whole(i)
                    gathered = self.shards.gather_whole(self.units[u], self.pairwise, self.group, self.device)
                    with self.cond:
                        self._gathered[u] = gathered
                    gathered.future.add_done_callback(partial(self._landed, u))
        except BaseException as exc:  # noqa: BLE001 - reported to the training thread
            self._fail(exc)

    def _landed(self, u: int, future: torch.futures.Future) -> None:
        try:
            future.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the training thread
            self._fail(exc)
            return
        with self.cond:
            self.queue.landed(u)
            self.cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()


class FullyShardedStep(ShardedStep):
    """The training thread's side: sharded's step, clipping and checkpoint, and the units'
    gathers and frees around every forward and backward pass."""

    def __init__(self, shards: Shards, exchange: Exchange, group: Callable[[], dist.ProcessGroup],
                 handover: Handover, updates: DeferredUpdates, timeout_s: float,
                 gatherer: Callable[[Sequence[Sequence[int]]], Gatherer]) -> None:
        super().__init__(shards, exchange, group, handover, updates, timeout_s)
        self._gatherer_for = gatherer
        self.gatherer: Gatherer | None = None
        self.unit_of: dict[int, int] = {}  # parameter -> its unit
        self._module_unit: dict[nn.Module, int] = {}
        self._order: list[int] = []  # the units in the order the latest forward pass with gradients ended them
        self._ended: list[int] = []  # ... in the pass under way
        self._keep: set[int] = set()  # units that stay whole after their forward pass
        self._computed_count: dict[int, int] = {}  # unit -> its parameters' gradients computed in this backward
        self._taken: set[str] = set()  # state_dict keys load_state_dict() took into the shards
        self._inside: dict[int, int] = {}  # unit of several modules -> how many of them are in their forward pass

    def attach(self, params: Sequence[torch.Tensor], waits: ModuleWaits) -> list[Any]:
        modules = list(waits.of)
        members = _tied_units(list(waits.of.values()))  # modules that own a parameter together: one unit
        units = [list(dict.fromkeys(i for m in group for i in waits.of[modules[m]])) for group in members]
        handles = super().attach(params, waits)
        for u, group in enumerate(members):
            for m in group:
                self._module_unit[modules[m]] = u
            for i in units[u]:
                self.unit_of[i] = u
            if len(group) > 1:  # freed only once none of its modules is inside its forward pass
                handles += [modules[m].register_forward_pre_hook(Hook(partial(self._entering, u))) for m in group]
        self.gatherer = self._gatherer_for(units)
        self._order = list(range(len(units)))  # the first forward pass: as the modules are registered
        handles += [module.register_forward_hook(Hook(partial(self._after_module, u)))
                    for module, u in self._module_unit.items()]
        handles.append(waits.model.register_forward_pre_hook(Hook(self._before_pass)))
        handles.append(waits.model.register_forward_hook(Hook(self._after_pass)))
        # on each gradient as it is computed, before it is accumulated and handed over to the plane
        # (whose post-accumulate hooks come next): a unit is freed, and the next one's gather due,
        # before its last gradient's reduce-scatter may start, which then waits behind the gather
        handles += [p.register_hook(partial(self._computed, self.unit_of[i])) for i, p in enumerate(params)]
        # (torch marks a hook function as its public API's: a bound method cannot carry the mark)
        handles.append(waits.model.register_state_dict_post_hook(partial(FullyShardedStep._sharded_state, self)))
        handles.append(waits.model.register_load_state_dict_pre_hook(partial(FullyShardedStep._load_shards, self)))
        handles.append(waits.model.register_load_state_dict_post_hook(partial(FullyShardedStep._loaded, self)))
        for u in range(len(units)):  # every rank holds its shards alone from now on (the queue's start)
            self.gatherer.release(u)
        self.gatherer.start()
        return handles

    def close(self, wait: bool) -> None:
        """Every parameter whole again, the model the user's as before the wrap (with ``wait``:
        every rank gathers; else the parameters stay freed: a failed run)."""
        gatherer, self.gatherer = self.gatherer, None
        if gatherer is None:
            return
        try:
            if wait:
                gatherer.want(range(len(gatherer.units)))
                gatherer.settle("every parameter (close)")
        finally:
            gatherer.stop()

    # -- the model's state_dict() ----------------------------------------------------------------
    def _sharded_state(self, module: nn.Module, state: dict, prefix: str, metadata: Any) -> None:
        """``model.state_dict()``: each parameter this rank's shard of it, a DTensor (as FSDP2's),
        which needs no collective; ``full_tensor()`` of it (on every rank) is the whole value."""
        self.wait_all()
        for i, name in enumerate(self.shards.names):
            if prefix + name in state:
                state[prefix + name] = self.shards.param_of(i)

    def _load_shards(self, module: nn.Module, state: dict, prefix: str, metadata: Any, strict: bool,
                     missing: list, unexpected: list, errors: list) -> None:
        """``model.load_state_dict()``: this rank's shard of each parameter from its entry (whole,
        or a DTensor of :meth:`_sharded_state`'s), taken out of torch's way (the parameter itself
        holds no memory to copy into); :meth:`_loaded` tells torch it was not missing."""
        self.wait_all()
        self._taken = set()
        for i, name in enumerate(self.shards.names):
            value = state.pop(prefix + name, None)
            if value is not None:
                try:
                    self.shards.load(i, value)
                except ValueError as exc:
                    errors.append(str(exc))
                self._taken.add(prefix + name)

    def _loaded(self, module: nn.Module, incompatible: Any) -> None:
        taken, self._taken = self._taken, set()
        incompatible.missing_keys[:] = [key for key in incompatible.missing_keys if key not in taken]

    # -- forward and backward --------------------------------------------------------------------
    def _units_of(self, indices: Sequence[int]) -> list[int]:
        return list(dict.fromkeys(self.unit_of[i] for i in indices))

    def _before_pass(self, module: nn.Module, args: Any) -> None:
        """A forward pass begins: every freed unit queued, in the order the latest pass ran them."""
        if self.gatherer is not None:
            self._ended = []
            self._keep = self.gatherer.queue.keep_after_forward(self._order) if torch.is_grad_enabled() else set()
            self.gatherer.want(self._order)

    def before_forward(self, indices: Sequence[int], what: str) -> bool:
        """A module's forward pass: its parameters whole (its own unit, and any it adopted)."""
        if self.gatherer is not None:
            self.gatherer.wait_whole(self._units_of(indices), what)
        return False

    def _entering(self, u: int, module: nn.Module, args: Any) -> None:
        """A module of unit ``u``, which several modules share (tied weights), begins its forward pass."""
        self._inside[u] = self._inside.get(u, 0) + 1

    def _after_module(self, u: int, module: nn.Module, args: Any, output: Any) -> None:
        if self.gatherer is None:
            return
        self._ended.append(u)
        outputs = [t for t in _tensors(output) if t.requires_grad]
        if torch.is_grad_enabled() and outputs:  # its backward pass starts from its outputs' gradients
            torch.autograd.graph.register_multi_grad_hook(outputs, partial(self._before_backward, u), mode="any")
        if u in self._inside:  # a unit of several modules: whole while any of them runs (one inside another)
            self._inside[u] -= 1
            if self._inside[u]:
                return
        if u not in self._keep:
            self.gatherer.free(u)

    def _after_pass(self, module: nn.Module, args: Any, output: Any) -> None:
        """A forward pass ended: with gradients, the freed units queued for the backward pass,
        the last one run first."""
        if self.gatherer is None or not torch.is_grad_enabled():
            return
        self._order = list(dict.fromkeys(self._ended))
        self._computed_count = {}
        self.gatherer.want(list(reversed(self._order)))

    def _before_backward(self, u: int, grads: Any) -> None:
        if self.gatherer is not None:
            self.gatherer.wait_whole([u], f"the parameters of unit {u} (backward)")

    def _computed(self, u: int, grad: torch.Tensor) -> None:
        """A gradient of a parameter of unit ``u`` computed: once all of them are, its backward
        pass is over (autograd has run what read its parameters) and the unit is freed."""
        count = self._computed_count.get(u, 0) + 1
        self._computed_count[u] = count
        if self.gatherer is not None and count == len(self.gatherer.units[u]):
            self.gatherer.free(u)

    def gather_model(self) -> GatherModel | None:
        """The units the latest forward pass with gradients ran, in its order, with their bytes
        and the budget: what the backward pass's gathers put on the link (None before the wrap)."""
        gatherer = self.gatherer
        if gatherer is None:
            return None
        names = self.shards.names
        order = [u for u in self._order if gatherer.units[u]]
        return GatherModel(tuple(tuple(names[i] for i in gatherer.units[u]) for u in order),
                           tuple(gatherer.queue.sizes[u] for u in order), gatherer.queue.budget)

    # -- step and waits --------------------------------------------------------------------------
    def _updated(self, plan: Plan) -> None:
        """Nothing to gather now: each module's parameters are gathered when its forward pass
        comes (the shards the gathers read are the updated ones)."""

    def wait_all(self) -> None:
        """Every gather queued landed, and every unit freed (the shards are about to change, or
        a checkpoint reads them)."""
        gatherer = self.gatherer
        if gatherer is not None:
            gatherer.settle("queued parameters")
            gatherer.free_all()

    def wait(self, indices: Sequence[int], what: str) -> None:
        if self.gatherer is not None:
            self.gatherer.wait_whole(self._units_of(indices), what)


def _tied_units(owned: Sequence[Sequence[int]]) -> list[list[int]]:
    """The units, each a list of positions in ``owned`` (the parameters each module owns): one per
    module, except that modules owning a parameter together (tied weights) share one, as FSDP2
    puts tied weights in one unit.

    >>> _tied_units([[0, 1], [2], [3, 0], [4]])
    [[0, 2], [1], [3]]
    """
    group = list(range(len(owned)))

    def root(m: int) -> int:
        while group[m] != m:
            group[m] = group[group[m]]
            m = group[m]
        return m

    first: dict[int, int] = {}  # parameter -> the first module owning it
    for m, indices in enumerate(owned):
        for i in indices:
            if i in first:
                group[root(m)] = root(first[i])
            else:
                first[i] = m
    units: dict[int, list[int]] = {}
    for m in range(len(owned)):
        units.setdefault(root(m), []).append(m)
    return list(units.values())


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (nested tuples, lists and dicts)."""
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
