"""Deferred updates: the user's optimizer applied per parameter once its gradient is reduced.

``optimizer.step()`` records each parameter group's hyper-parameters (a *snapshot*, so a
learning-rate scheduler stepped right after cannot leak into this step) and marks every
parameter with a gradient as pending. A pending parameter is updated, with its snapshot,
as soon as its reduction is known to be complete: at the latest in the forward pre-hook
of the module that uses it. ``zero_grad()`` on a parameter still pending or on the wire
waits the same way. The update is the wrapped optimizer's own ``step()``, run with each
group's ``params`` narrowed to the parameters being updated.

AMP's ``GradScaler`` hands a fused optimizer (``fused=True``: it unscales inside its own
kernel) the scale and the overflow flag as attributes (``grad_scale``, ``found_inf``) for the
duration of ``step()`` only; the snapshot keeps them, so an update applied later still
unscales, and still skips a step that overflowed.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence

import torch

from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.training.inflight import Handover
from gradsched.runtime.torch_private import GRAD_SCALER_ATTRIBUTES
from gradsched.runtime.diagnostics.tracing import RunTrace

SCALING = GRAD_SCALER_ATTRIBUTES  # what GradScaler sets on a fused optimizer around its step()


class Snapshot(NamedTuple):
    """What a ``step()`` updates with: every group's hyper-parameters, and AMP's scaling."""

    groups: list[dict[str, Any]]
    scaling: dict[str, Any]


class DeferredUpdates:
    def __init__(self, optimizer: torch.optim.Optimizer | None, params: Sequence[torch.Tensor],
                 names: Sequence[str], exchange: Exchange, handover: Handover, trace: RunTrace | None) -> None:
        self.optimizer = optimizer  # None until a model wrapped before its optimizer sees it step
        self.params = list(params)
        self.names = list(names)
        self.exchange = exchange
        self.handover = handover
        self.trace = trace
        self.applying = False  # inside the wrapped optimizer's step() on a subset of parameters
        self.update: dict[int, Snapshot] = {}  # parameter -> hyper-parameters to update it with
        self.zero: dict[int, bool] = {}  # parameter -> set_to_none, once updated and reduced
        self.run_on: dict[int, torch.Tensor] | None = None  # sharded: id(parameter) -> the tensor stepped instead
        self._where_key: tuple = ()
        self._where_map: dict[int, tuple[int, int, torch.Tensor]] = {}
        self._pair_bound: list[int] = []  # per group: the most temporaries its full step holds (see pair_bytes)

    def pending(self, i: int) -> bool:
        return i in self.update or i in self.zero

    def snapshot(self) -> Snapshot:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        return Snapshot(groups, {name: getattr(self.optimizer, name) for name in SCALING
                                 if getattr(self.optimizer, name, None) is not None})

    def request_step(self, indices: Sequence[int], snapshot: Snapshot) -> None:
        """Mark ``indices`` for an update with ``snapshot``; apply at once those this thread can
        apply without waiting (reduced and ended, or settled already): on NCCL a gradient is
        resolved once queued, and an update applied now would put the next forward pass's
        every kernel behind every reduction (the Dependency Proxy lost)."""
        now = []
        for i in indices:
            self.update[i] = snapshot
            if self.ready_now(i):
                now.append(i)
        self.apply(now)

    def ready_now(self, i: int) -> bool:
        """Gradient ``i`` may be used now without waiting for the device."""
        return self.exchange.ended(i) if i in self.handover.unsettled else not self.exchange.in_flight(i)

    def request_zero(self, set_to_none: bool) -> None:
        now = []
        for i in range(len(self.params)):
            if i in self.update or not self.ready_now(i):
                self.zero[i] = set_to_none
            else:
                now.append(i)
        self.handover.settle(now)  # at once: on CUDA one stream wait per message, not per gradient
        for i in now:
            clear_grad(self.params[i], set_to_none)

    def wait_and_apply(self, indices: Sequence[int], what: str) -> None:
        """Wait for the reductions of ``indices``, then apply everything pending and reduced."""
        started = time.perf_counter()
        indices = list(indices)
        self.handover.wait(indices, what)  # reduced, and settled: on CUDA the current stream waits for them
        if self.trace:
            self.trace.span("wait", what, started, time.perf_counter())
        self.apply(sorted({i for i in [*self.update, *self.zero] if not self.exchange.in_flight(i)}))

    def apply(self, indices: Sequence[int]) -> None:
        """Apply the pending updates of ``indices`` (grouped by snapshot), then their zeroing."""
        self.handover.settle(indices)
        by_snapshot: dict[int, tuple[Snapshot, list[int]]] = {}
        for i in indices:
            snapshot = self.update.pop(i, None)
            if snapshot is not None:
                by_snapshot.setdefault(id(snapshot), (snapshot, []))[1].append(i)
        for snapshot, members in by_snapshot.values():
            self.apply_now(members, snapshot)
        for i in indices:
            set_to_none = self.zero.pop(i, None)
            if set_to_none is not None:
                clear_grad(self.params[i], set_to_none)

    def step_others(self, scheduled: dict[int, int]) -> None:
        """Step the optimizer's parameters that are not ``scheduled`` (gradsched's plans leave
        them out: sparse ones, reduced in backward(); those DDP is told to ignore, local) and
        hold a gradient now, as DDP's optimizer steps them: at once."""
        if self.optimizer is not None:
            self.step_only({id(p) for g in self.optimizer.param_groups for p in g["params"]
                            if id(p) not in scheduled and p.grad is not None}, self.snapshot())

    def apply_now(self, indices: Sequence[int], snapshot: Snapshot) -> None:
        """Run the optimizer's step on ``indices`` only, with ``snapshot``'s hyper-parameters."""
        self.step_only({id(self.params[i]) for i in indices}, snapshot)

    def _where(self) -> dict[int, tuple[int, int, torch.Tensor]]:
        """``id(parameter)`` -> (its group, its position there, the parameter) in the
        optimizer, made again only when the groups change: a partial step costs what it
        updates, not what the optimizer holds."""
        groups = self.optimizer.param_groups
        key = (id(self.optimizer), tuple((id(g["params"]), len(g["params"])) for g in groups))
        if self._where_key != key:
            self._where_key = key
            self._where_map = {id(p): (g, k, p) for g, group in enumerate(groups)
                               for k, p in enumerate(group["params"])}
            self._pair_bound = [max(map(pair_bytes, [None, *group["params"]], group["params"]), default=0)
                                for group in groups]
        return self._where_map

    def step_only(self, chosen: set[int], snapshot: Snapshot) -> None:
        """Run the optimizer's step on the parameters whose ``id`` is in ``chosen``, with
        ``snapshot``'s hyper-parameters: one ``step()`` per run of them (the runs of every group
        together), cut where two of them are not neighbours in their group and would hold more
        temporaries side by side than any two neighbours in the group's full step (torch's
        per-tensor loops keep the last tensor's temporaries while the next one's are computed:
        two weights in a row, where the full step has a bias between, held a layer more)."""
        if not chosen:
            return
        started = time.perf_counter()
        members: dict[int, list[tuple[int, torch.Tensor]]] = {}  # group -> (position, parameter) chosen
        where = self._where()
        for pid in chosen:
            place = where.get(pid)
            if place is not None:
                members.setdefault(place[0], []).append(place[1:])
        runs = {g: runs_within(sorted(chosen_here, key=lambda m: m[0]), self._pair_bound[g])
                for g, chosen_here in members.items()}
        for j in range(max(map(len, runs.values()), default=0)):
            self._step_with({g: [p for _, p in group_runs[j]] for g, group_runs in runs.items()
                             if j < len(group_runs)}, snapshot)
        if self.trace:
            self.trace.span("update", f"{len(chosen)} parameters", started, time.perf_counter())

    def _step_with(self, chosen: dict[int, list[torch.Tensor]], snapshot: Snapshot) -> None:
        """One ``step()`` of the optimizer with each group's ``params`` narrowed to ``chosen``'s
        (group -> parameters; none where absent) and ``snapshot``'s hyper-parameters."""
        saved = []
        for g, (group, values) in enumerate(zip(self.optimizer.param_groups, snapshot.groups)):
            saved.append((group["params"], {k: group[k] for k in values}))
            chosen_here = chosen.get(g, [])
            if self.run_on is not None:  # sharded: this rank's shards in their parameters' place
                chosen_here = [self.run_on[id(p)] for p in chosen_here if id(p) in self.run_on]
            group["params"] = chosen_here
            group.update(values)
        absent = object()
        scaling = {name: getattr(self.optimizer, name, absent) for name in snapshot.scaling}
        for name, value in snapshot.scaling.items():
            setattr(self.optimizer, name, value)
        self.applying = True
        try:
            self.optimizer.step()
        finally:
            self.applying = False
            for group, (params, values) in zip(self.optimizer.param_groups, saved):
                group["params"] = params
                group.update(values)
            for name, value in scaling.items():  # as GradScaler left them (it deletes them after its step())
                if value is absent:
                    delattr(self.optimizer, name)
                else:
                    setattr(self.optimizer, name, value)


def pair_bytes(before: torch.Tensor | None, p: torch.Tensor) -> int:
    """What a per-tensor optimizer loop holds of temporaries while it updates ``p`` right after
    ``before``: ``before``'s last one, still bound, and two of ``p``'s (AdamW's ``sqrt`` and
    its division)."""
    return (0 if before is None else before.nbytes) + 2 * p.nbytes


def runs_within(placed: Sequence[tuple[int, torch.Tensor]], bound: int) -> list[list[tuple[int, torch.Tensor]]]:
    """``placed`` ((position in the group, parameter), by position) cut between two that are not
    neighbours in the group and whose :func:`pair_bytes` exceeds ``bound``.

    >>> w, b = torch.zeros(100), torch.zeros(10)
    >>> [[k for k, _ in run] for run in runs_within([(0, w), (2, w), (3, b), (5, b), (6, w)], 40 + 2 * 400)]
    [[0], [2, 3, 5, 6]]
    """
    runs: list[list[tuple[int, torch.Tensor]]] = []
    for position, p in placed:
        if runs and (runs[-1][-1][0] == position - 1 or pair_bytes(runs[-1][-1][1], p) <= bound):
            runs[-1].append((position, p))
        else:
            runs.append([(position, p)])
    return runs


def clear_grad(p: torch.Tensor, set_to_none: bool) -> None:
    """What ``Optimizer.zero_grad`` does to one parameter."""
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()
