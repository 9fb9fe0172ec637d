"""The training thread's side of ``architecture="sharded"`` (:mod:`gradsched.runtime.architectures.sharded.shards`):
a :class:`~gradsched.runtime.training.architecture.Stepping`.

* ``step()`` waits until every message of the round is reduce-scattered (this rank then holds
  the average of its shard of every gradient), runs the user's optimizer on this rank's
  shards only (its hyper-parameters, groups and schedulers as the user set them; its state
  for the shards alone: 1/n of DDP's), then queues the all-gathers of the updated parameters
  on the launcher, message by message, the first layers' first;
* each module's forward waits only for the all-gathers of its own parameters (the Dependency
  Proxy, guarding parameters);
* clipping works on the shards: a global norm from the shards' norms (one small all-reduce,
  issued in the data group's order by the launcher), values clamped shard by shard.

Between steps the optimizer's state is keyed by the user's parameters, as torch keeps it,
and holds this rank's shard of each (``optimizer.state_dict()`` is this rank's part).
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from gradsched.core.gathers import GatherModel
from gradsched.core.plan import Plan
from gradsched.runtime import torch_api
from gradsched.runtime.comm import wire_format
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.wire_format import StateKeys
from gradsched.runtime.architectures.sharded.shards import Gathered, Shards
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.training.inflight import Handover, plain
from gradsched.runtime.training.waits import ModuleWaits
from gradsched.runtime.training.updates import DeferredUpdates, Snapshot

#: the entry of an optimizer's ``state_dict()`` that says whose shards it holds (rank, ranks)
SHARDS_OF = "gradsched_shards_of"

def _local_rows(value: Any) -> Any:
    """A state value as the optimizer keeps it here: a DTensor's rows on this rank, flat (a
    replicated one whole), anything else as it is."""
    if not isinstance(value, DTensor):
        return value
    if all(placement.is_replicate() for placement in value.placements):
        return value.to_local()
    return value.to_local().reshape(-1)


#: Optimizers whose update of an element reads only that element (and its own state): run on
#: a shard they give exactly what they give on the whole tensor. Subclasses count as theirs.
ELEMENTWISE = tuple(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop")
    if hasattr(torch.optim, name))


def check_elementwise(optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer that needs whole tensors (a shard is not enough), naming why. An
    optimizer class of one's own says it is elementwise with ``gradsched_elementwise = True``."""
    if not isinstance(optimizer, ELEMENTWISE) and not getattr(type(optimizer), "gradsched_elementwise", False):
        raise GradschedError(
            f"architecture='sharded' runs the optimizer on each rank's shard of every parameter, which gives the "
            f"whole tensor's update only for optimizers that update each element from that element alone "
            f"({', '.join(c.__name__ for c in ELEMENTWISE)}); {type(optimizer).__name__} is not known to be one "
            "(LBFGS needs every gradient at once, Adafactor and Shampoo-like ones the tensors' shapes): "
            "use architecture='allreduce'")


class ShardedStep:
    def __init__(self, shards: Shards, exchange: Exchange, group: Callable[[], dist.ProcessGroup],
                 handover: Handover, updates: DeferredUpdates, timeout_s: float) -> None:
        self.shards = shards
        self.exchange = exchange
        self.device = exchange.device
        self.group = group  # the data group (read when used: released at close)
        self.handover = handover
        self.updates = updates
        self.timeout_s = timeout_s
        self._queued: Callable[[], list[tuple[list[int], Gathered]]] | None = None
        self._waiting: dict[int, list[Gathered]] = {}  # parameter -> the gathers it waits for
        self._presenting = True  # state_dict() shows the shards as DTensors (not inside full_state_dict)
        self._presented: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> a DTensor state_dict()
        #   made here (by identity: tensors compare elementwise)
        handover.reduced_grad = lambda i, _: shards.grad_of(i)  # .grad: this rank's shard of the average

    def attach(self, params: Sequence[torch.Tensor], waits: ModuleWaits) -> list[Any]:
        """Before autograd accumulates into a parameter whose ``.grad`` is this rank's averaged
        shard (a DTensor: a plain gradient cannot be added to it), that shard is set aside and
        ``.grad`` emptied; it is added to the next average once reduced, as DDP's ``.grad`` adds
        a backward pass's average to what it held."""
        return [p.register_hook(partial(self._before_accumulating, i)) for i, p in enumerate(params)]

    def close(self, wait: bool) -> None:
        """Nothing: every parameter is whole on every rank throughout."""

    def local_gradient(self, i: int) -> None:
        """Refused onto an averaged shard: a backward pass that does not communicate (``no_sync()``)
        reached a parameter whose ``.grad`` held this rank's shard of the average (set aside by
        :meth:`_before_accumulating`): the whole local gradient cannot be added to it as DDP adds it."""
        if i in self.handover.added:
            raise GradschedError(
                f"architecture='sharded': a backward pass under no_sync() (or require_backward_grad_sync=False) "
                f"reached {self.shards.names[i]!r}, whose .grad held this rank's shard of the average of the backward "
                "pass before (no zero_grad() since), which cannot take a whole local gradient as DDP's does: call "
                "zero_grad() after step(), or use architecture='allreduce'")

    def accumulated(self, i: int) -> None:
        """Refused: ``.grad`` holds this rank's shard of the average, which a whole local gradient
        cannot be added to as DDP adds it."""
        raise GradschedError(
            f"architecture='sharded': a second backward pass over a forward pass that communicated "
            f"(retain_graph) reached {self.shards.names[i]!r}, whose .grad holds this rank's shard of the average "
            "and cannot take a whole local gradient as DDP's does; run that forward pass inside no_sync() "
            "(every backward pass over it then accumulates locally), or use architecture='allreduce'")

    def _before_accumulating(self, i: int, grad: torch.Tensor) -> None:
        if i in self.handover.unsettled:  # handed over since the latest forward pass: a later backward pass
            self.accumulated(i)
        p = self.shards.params[i]
        held = plain(p.grad)
        if isinstance(held, DTensor):
            kept = self.handover.added.get(i)
            self.handover.added[i] = held.clone() if kept is None else kept.add_(held)
            p.grad = None

    # -- step ---------------------------------------------------------------------------------
    def step(self, snapshot: Snapshot, plan: Plan, reduced: bool) -> None:
        """Update this rank's shards with ``snapshot``; queue the gathers of ``plan``'s messages.

        Gradients this rank holds whole and alone (set by hand, accumulated under ``no_sync()``,
        none at all) are what DDP's replicas step with, each its own: where they are the same on
        every rank (``torch.distributed.checkpoint`` sets zeros to make an optimizer's state, say),
        each rank steps its shard with its part of them, as DDP's replicas step alike; where they
        differ, DDP's replicas would part, which shards cannot, and the step is refused. Whether
        they are the same is one collective, held where no backward pass communicated since the
        previous step (``reduced`` False: every rank alike)."""
        everything = range(len(self.shards.params))
        self.wait_all()  # the previous step's gathers (a step without a forward between)
        self.shards.refresh()  # with compression: masters of parameters someone else wrote
        self.handover.wait(everything, "all gradients (the sharded step)")
        own = [i for i, p in enumerate(self.shards.params)
               if p.grad is not None and not isinstance(plain(p.grad), DTensor)]
        if self.updates.optimizer is not None and ((own and reduced) or (not reduced and not self._alike(own))):
            names = [self.shards.names[i] for i in own[:3]]
            raise GradschedError(
                f"architecture='sharded': step() on gradients this rank holds alone, not averaged (e.g. {names}: "
                "set by hand, or accumulated under no_sync() since the last backward pass that synced), "
                f"{'after a backward pass that synced' if reduced else 'not the same on every rank'}; each rank "
                "updates only its shard of every parameter, so the ranks cannot step apart as DDP's replicas then "
                "do: step after a backward pass that synced, set the same gradients on every rank, or use "
                "architecture='allreduce'")
        if self.updates.optimizer is not None:
            with self._on_shards(everything):
                self.updates.apply_now(everything, snapshot)
        self._updated(plan)

    def _updated(self, plan: Plan) -> None:
        """The shards are updated: queue the all-gathers of ``plan``'s messages on the launcher."""
        order = sorted(range(len(plan.messages)),  # the first layers first
                       key=lambda k: min(self.shards.index[name] for name in plan.messages[k].tensors))
        messages = [plan.messages[k] for k in order]
        self._queued = self.exchange.after_launched(lambda: self._gather(messages))

    def _gather(self, messages: Sequence[Any]) -> list[tuple[list[int], Gathered]]:
        """On the launcher thread, in the data group's order: every message's all-gather."""
        group = self.group()
        return [([self.shards.index[name] for name in m.tensors],
                 self.shards.gather(m, group, self.device)) for m in messages]

    @contextmanager
    def _on_shards(self, indices: Sequence[int]) -> Iterator[None]:
        """The optimizer steps this rank's shards of ``indices`` in the parameters' place: each
        shard gets its averaged gradient and the parameter's state for the step."""
        optimizer, shards = self.updates.optimizer, self.shards
        state = optimizer.state
        moved = []
        for i in indices:
            p, shard = shards.params[i], shards.tensors[i]
            if p.grad is None:
                continue  # (an empty shard steps: its state, empty, is what FSDP2's ranks hold and what
                #           torch.distributed.checkpoint expects from every rank)
            shard.grad = self._local_grad(i)
            if p in state:
                state[shard] = self._shard_of_state(state.pop(p), p, i)
            moved.append((p, shard))
        self.updates.run_on = {id(p): shard for p, shard in moved}
        try:
            yield
        finally:
            self.updates.run_on = None
            for p, shard in moved:
                if shard in state:
                    state[p] = state.pop(shard)
                shard.grad = None

    def _shard_of_state(self, entry: dict, p: torch.Tensor, i: int) -> dict:
        """A parameter's state for its shard: state made whole (an optimizer that fills it in its
        constructor, Adagrad; a full state loaded) is cut to this rank's part, once; 1/n of it is
        kept. A 0-dimensional parameter's (saved as one value) becomes its one-element shard's,
        its step aside (torch's optimizers keep ``step`` as a 0-dimensional tensor of their own)."""
        shard, start = self.shards.tensors[i], self.shards.start[i]
        for key, value in entry.items():
            if not torch.is_tensor(value) or value.shape != p.shape:
                continue
            if value.numel() != shard.numel():
                entry[key] = value.detach().reshape(-1)[start:start + shard.numel()].clone()
            elif p.dim() == 0 and key != "step":
                entry[key] = value.view(1)
        return entry

    def gather_model(self) -> GatherModel | None:
        """Nothing beside the reduce-scatters in the backward pass (the gathers follow the step)."""
        return None

    def full_state_dict(self, rank0_only: bool = True) -> dict:
        """The optimizer's ``state_dict()`` with every rank's shards joined: what the same optimizer
        would hold without sharding, loadable into it (on every rank: the DDP habit of saving on
        rank 0 and loading everywhere). A collective: every rank calls it. Whole on rank 0 (of the
        data group) only with ``rank0_only`` (the others get the groups and no state, as FSDP's
        full optimizer state on rank 0), on every rank without; the live state stays this rank's
        shards either way (the joined tensors are the result's alone)."""
        optimizer, shards = self.updates.optimizer, self.shards
        self.wait_all()
        self._presenting = False  # this rank's shards as they are, keyed by position in the groups
        try:
            saved = optimizer.state_dict()
        finally:
            self._presenting = True
        # torch's state_dict() shares each parameter's state dict with the optimizer: copies, so that
        # the joined tensors replace nothing the optimizer holds
        saved["state"] = {position: dict(entry) for position, entry in saved["state"].items()}
        positions = [p for group in optimizer.param_groups for p in group["params"]]
        here = {}  # (parameter index, key) -> the state entry holding it, for this rank's shard-sized tensors
        for position, p in enumerate(positions):
            i = shards.of_param.get(id(p))
            entry = saved["state"].get(position)
            for key, value in (entry or {}).items():
                if i is not None and torch.is_tensor(value) and value.dim() > 0 and \
                        value.numel() == shards.tensors[i].numel():
                    here[(i, key)] = entry
        receives = shards.rank == 0 or not rank0_only

        def gather() -> None:  # on the launcher: the data group's order
            group = self.group()
            # the keys travel in the wire format (a rank may lack a parameter's state: one without a gradient)
            known = wire_format.all_gather("state_keys", StateKeys(sorted(here)), group, shards.params[0].device)
            for i, key in sorted({tuple(k) for part in known for k in part.keys}):
                entry = here.get((i, key))
                joined = self._joined(i, entry[key] if entry is not None else None, group, rank0_only)
                if entry is not None and joined is not None:
                    entry[key] = joined

        self.exchange.between_rounds(partial(self.device.run, self.group(), gather))
        if not receives:
            saved["state"] = {}
        return saved

    def state_saved(self, state_dict: dict) -> None:
        """This rank's part of the state, as FSDP2 holds its: each shard-sized tensor a
        :class:`DTensor` ``Shard(0)`` of its parameter's shape (rows, as :mod:`.shards` cuts
        them), so that ``torch.distributed.checkpoint`` saves each rank's rows and loads them
        under any number of ranks or any architecture; and marked with whose part it is (an
        entry torch's optimizers ignore), so that loading it on another rank is refused rather
        than training wrong. The optimizer's own state is not touched (the per-parameter dicts
        torch shares are replaced by copies)."""
        if not self._presenting:
            return
        positions = [p for group in self.updates.optimizer.param_groups for p in group["params"]]
        state = dict(state_dict["state"])
        for position, entry in state.items():
            i = self.shards.of_param.get(id(positions[position])) if position < len(positions) else None
            if i is not None:
                state[position] = {key: self._as_dtensor(i, value) for key, value in entry.items()}
        state_dict["state"] = state
        state_dict[SHARDS_OF] = {"rank": self.shards.rank, "ranks": self.shards.world}

    def _as_dtensor(self, i: int, value: Any) -> Any:
        """``value`` as a DTensor ``Shard(0)`` of parameter ``i``'s shape if it is this rank's
        shard of a state tensor (this rank's rows; all of them where it owns every row, as rank
        0 does a weight of one row), or as a 0-dimensional tensor if it is the state of a
        0-dimensional parameter (replicated: every rank holds the whole value); else as
        it is (a whole tensor loaded from a full state and not yet cut, a step)."""
        p, shard = self.shards.params[i], self.shards.tensors[i]
        if not (torch.is_tensor(value) and value.dim() > 0 and value.numel() == shard.numel()):
            return value
        if p.dim() == 0:
            return value.view(())
        presented = DTensor.from_local(value.detach().view(-1, *p.shape[1:]), self.shards.mesh, [Shard(0)],
                                       shape=p.shape, stride=p.stride(), run_check=False)
        self._presented[id(presented)] = presented
        return presented

    def state_loading(self, state_dict: dict) -> None:
        """Refuse another rank's part (its shards are not this rank's, though they may have the
        same sizes); a whole state (``full_state_dict()``, a run without sharding) loads anywhere;
        DTensors become this rank's rows. A state whose DTensors this rank handed out itself
        (``torch.distributed.checkpoint`` loads into them in place) is this rank's whatever its
        mark says (the checkpoint keeps one rank's)."""
        mark = state_dict.pop(SHARDS_OF, None)
        here = {"rank": self.shards.rank, "ranks": self.shards.world}
        values = [v for entry in state_dict.get("state", {}).values() for v in entry.values()]
        mine = any(isinstance(v, DTensor) and self._presented.get(id(v)) is v for v in values)
        if mark is not None and mark != here and not mine:
            raise GradschedError(
                f"optimizer.load_state_dict: this state is rank {mark['rank']}'s part of a sharded optimizer's state "
                f"(of {mark['ranks']} ranks), and this is rank {here['rank']} of {here['ranks']}: each rank holds "
                "only its shards, so each must load the part it saved (optimizer.state_dict() on every rank), or "
                "save the whole state once with optimizer.full_state_dict() (joined on rank 0, loadable on every "
                "rank), or use torch.distributed.checkpoint")
        state_dict["state"] = {position: {key: _local_rows(value) for key, value in entry.items()}
                               for position, entry in state_dict.get("state", {}).items()}

    def _joined(self, i: int, value: torch.Tensor | None, group: dist.ProcessGroup,
                rank0_only: bool) -> torch.Tensor | None:
        """Parameter ``i``'s state tensor joined from every rank's shard (``value``: this rank's,
        None where its shard is empty), in the parameter's shape; on rank 0 only with
        ``rank0_only`` (None elsewhere)."""
        p, c = self.shards.params[i], self.shards.size[i]
        padded = torch.zeros(c, dtype=p.dtype if value is None else value.dtype, device=p.device)
        if value is not None:
            padded[:value.numel()] = value.reshape(-1)
        if rank0_only:
            parts = [torch.empty_like(padded) for _ in range(self.shards.world)] if self.shards.rank == 0 else None
            dist.gather(padded, parts, group_dst=0, group=group)
            if parts is None:
                return None
            joined = torch.cat(parts)
        else:
            joined = padded.new_empty(c * self.shards.world)
            torch_api.all_gather_single(joined, padded, group=group)
        return joined[:p.numel()].view(p.shape).clone()

    # -- waits ---------------------------------------------------------------------------------
    def wait(self, indices: Sequence[int], what: str) -> None:
        """Block until the parameters ``indices`` are gathered (updated on every rank)."""
        if self._queued is not None:
            queued, self._queued = self._queued, None
            for members, gathered in queued():
                for i in members:
                    self._waiting.setdefault(i, []).append(gathered)
        deadline = time.monotonic() + self.timeout_s
        for i in indices:
            for gathered in self._waiting.pop(i, ()):
                gathered.wait(max(0.0, deadline - time.monotonic()), what)

    def wait_all(self) -> None:
        self.wait(range(len(self.shards.params)), "all parameters")

    def before_forward(self, indices: Sequence[int], what: str) -> bool:
        """A module's forward pass reads its own parameters only: their all-gathers (the time it
        waits for them is not a reduction's: not counted as one)."""
        self.wait(indices, what)
        return False

    def synchronize(self) -> None:
        self.wait_all()

    # -- clipping ------------------------------------------------------------------------------
    def _local_grad(self, i: int) -> torch.Tensor:
        """This rank's shard of parameter ``i``'s gradient, flat: a view of ``.grad``'s local part
        (the averaged gradient's valid elements), or of this rank's part of a whole gradient."""
        grad = plain(self.shards.params[i].grad)
        if isinstance(grad, DTensor):
            return grad.to_local().reshape(-1)[:self.shards.tensors[i].numel()]
        start = self.shards.start[i]
        return grad.reshape(-1)[start:start + self.shards.tensors[i].numel()]

    def _alike(self, own: Sequence[int]) -> bool:
        """Whether every rank holds the same whole gradients (``own``: those this rank holds; the
        same parameters, the same values), from the largest and the smallest of each element over
        the ranks, in the data group's order: first which parameters hold one (no rank any: alike,
        nothing more sent), then their values, in their own dtypes (the memory of two copies of
        those gradients, no more)."""
        params = self.shards.params
        mine = set(own)
        held = torch.tensor([float(i in mine) for i in range(len(params))], dtype=torch.float64,
                            device=params[0].device)
        if not self._extremes_equal([held]):
            return False
        if not mine:
            return True
        grads = [plain(params[i].grad).detach().reshape(-1) for i in sorted(mine)]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        wide = {torch.float16: torch.float32, torch.bfloat16: torch.float32}  # (exactly: what every backend reduces)
        return self._extremes_equal([torch.cat(group).to(wide.get(dtype, dtype)) for dtype, group in by_dtype.items()])

    def _extremes_equal(self, values: Sequence[torch.Tensor]) -> bool:
        """Whether each of ``values`` is the same on every rank (a pair of all-reduces each; NaN
        everywhere alike counts as alike)."""
        largest = [v.nan_to_num(nan=math.pi) if v.is_floating_point() else v.clone() for v in values]
        smallest = [v.clone() for v in largest]

        def compare() -> None:  # on the launcher: the data group's order
            group = self.group()
            for high, low in zip(largest, smallest):
                dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
                dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)

        self.exchange.between_rounds(partial(self.device.run, self.group(), compare))
        return all(torch.equal(high, low) for high, low in zip(largest, smallest))

    def _local_only(self) -> list[torch.Tensor] | None:
        """The parameters holding a gradient, if none is an averaged shard (all this rank's own: DDP
        clips them as they are); None if all are (the shards' way). A mix (some averaged, some set
        by hand) is refused."""
        held = [p for p in self.shards.params if p.grad is not None]
        averaged = sum(isinstance(plain(p.grad), DTensor) for p in held)
        if not averaged:
            return held
        if averaged < len(held):
            raise GradschedError("architecture='sharded': clipping gradients of which some are averaged shards and "
                                 "some this rank's own (set by hand, or accumulated locally since): clip before "
                                 "replacing gradients, or use torch.nn.utils.clip_grad_norm_ on the parameters")
        return None

    def _valid_grads(self, counted: bool = False) -> list[torch.Tensor]:
        """This rank's shard of every gradient held (``counted``: those this rank counts in a norm,
        a replicated scalar's on rank 0 alone)."""
        shards = self.shards
        return [self._local_grad(i) for i, (t, p) in enumerate(zip(shards.tensors, shards.params))
                if p.grad is not None and t.numel()
                and not (counted and i in shards.replicated and shards.rank != 0)]

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        """``clip_grad_norm_`` of the averaged gradients from the shards: the total norm from
        every rank's part (one all-reduce), then every shard scaled by the same factor. Gradients
        that were not averaged (accumulated under ``no_sync()``, set by hand) are this rank's own,
        whole: clipped here alone, as DDP's are."""
        self.handover.wait(range(len(self.shards.params)), "all gradients (clip_grad_norm_)")
        local = self._local_only()
        if local is not None:
            return torch.nn.utils.clip_grad_norm_(local, max_norm, norm_type, error_if_nonfinite, foreach)
        grads = self._valid_grads()
        norm_type = float(norm_type)
        device = self.shards.params[0].device
        norms = [torch.linalg.vector_norm(g, norm_type).to(torch.float64) for g in self._valid_grads(counted=True)]
        if math.isinf(norm_type):
            part = torch.stack(norms).max() if norms else torch.zeros((), dtype=torch.float64, device=device)
            op = dist.ReduceOp.MAX
        else:
            part = (torch.stack(norms) ** norm_type).sum() if norms else torch.zeros((), dtype=torch.float64,
                                                                                     device=device)
            op = dist.ReduceOp.SUM
        part = part.reshape(1)
        group = self.group()
        reduced = self.exchange.between_rounds(
            lambda: self.device.issue(group, lambda: dist.all_reduce(part, op=op, group=group, async_op=True)))
        reduced.wait()  # the norm is read on this thread's stream
        total = part[0] if math.isinf(norm_type) else part[0] ** (1.0 / norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is "
                               "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
                               "by the non-finite norm anyway, set `error_if_nonfinite=False`")
        dtype = functools.reduce(torch.promote_types, [g.dtype for g in grads], self.shards.params[0].dtype)
        coefficient = torch.clamp(max_norm / (total.to(dtype) + 1e-6), max=1.0)
        with torch.no_grad():
            for g in grads:
                g.mul_(coefficient.to(g.dtype))
        return total.to(dtype)

    def clip_value(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {value}")
        self.handover.wait(range(len(self.shards.params)), "all gradients (clip_grad_value_)")
        local = self._local_only()
        if local is not None:
            torch.nn.utils.clip_grad_value_(local, value)
            return
        with torch.no_grad():
            for g in self._valid_grads():
                g.clamp_(-value, value)
