"""Deferred updates: the user's optimizer applied per parameter once its gradient is reduced.

``optimizer.step()`` records each parameter group's hyper-parameters (a *snapshot*, so a
learning-rate scheduler stepped right after cannot leak into this step) and queues a step for
every parameter holding a gradient. A parameter's queue is applied as soon as its reduction is
known to be complete: at the latest in the forward pre-hook of the module that uses it.

What the user calls between ``step()`` and that moment must see what it would see under DDP,
where the step has already run. So each parameter's queue holds the user's actions in the order
they were called (steps, each with its snapshot; ``zero_grad(set_to_none=False)``), each with the
tensor ``.grad`` held when it was called, and an action works on that tensor, not on whatever
``.grad`` holds when the queue is applied:

* code that replaces ``.grad`` meanwhile (``model.zero_grad()``, ``p.grad = None``, a gradient
  set by hand) does not take the gradient away from a step called before, and a step called
  after it sees what it left (nothing to step, or the gradient set by hand); ``.grad`` ends as
  the user left it;
* code that operates on a gradient still queued for (``p.grad.zero_()``, a read, clipping) finds
  it still marked (:class:`~gradsched.runtime.training.inflight.InFlightGrad`): the mark first
  applies the queue, then the operation runs, as it would after DDP's step;
* a ``zero_grad()`` before ``step()`` discards that step's gradient, and two steps apply twice.

The update is the wrapped optimizer's own ``step()``, run with each group's ``params`` narrowed
to the parameters being updated.

AMP's ``GradScaler`` hands a fused optimizer (``fused=True``: it unscales inside its own
kernel) the scale and the overflow flag as attributes (``grad_scale``, ``found_inf``) for the
duration of ``step()`` only; the snapshot keeps them, so an update applied later still
unscales, and still skips a step that overflowed.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence, Union

import torch

from gradsched.runtime.training.inflight import Handover, InFlightGrad, Settled, plain
from gradsched.runtime.torch_private import GRAD_SCALER_ATTRIBUTES
from gradsched.runtime.diagnostics.tracing import RunTrace

SCALING = GRAD_SCALER_ATTRIBUTES  # what GradScaler sets on a fused optimizer around its step()


class Snapshot(NamedTuple):
    """What a ``step()`` updates with: every group's hyper-parameters, and AMP's scaling."""

    groups: list[dict[str, Any]]
    scaling: dict[str, Any]


Action = Union[Snapshot, bool]  # a step with its snapshot; or zero_grad(set_to_none=False)


class DeferredUpdates:
    """The user's optimizer applied per parameter, for the whole run: the backend that reduces
    lends it its handover while it lives (:meth:`serve`); without one every gradient is plain."""

    def __init__(self, optimizer: torch.optim.Optimizer | None, params: Sequence[torch.Tensor],
                 names: Sequence[str], trace: RunTrace | None) -> None:
        self.optimizer = optimizer  # None until a model wrapped before its optimizer sees it step
        self.params = list(params)
        self.names = list(names)
        self.handover: Handover | Settled = Settled()
        self.trace = trace
        self.applying = False  # inside the wrapped optimizer's step() on a subset of parameters
        # parameter -> the user's actions not yet applied, in order, each with the .grad it was called on
        self.queue: dict[int, list[tuple[Action, torch.Tensor]]] = {}
        self.run_on: dict[int, torch.Tensor] | None = None  # sharded: id(parameter) -> the tensor stepped instead
        self._where_key: tuple = ()
        self._where_map: dict[int, tuple[int, int, torch.Tensor]] = {}
        self._pair_bound: list[int] = []  # per group: the most temporaries its full step holds (see pair_bytes)

    def serve(self, handover: Handover | None) -> None:
        """From now on the gradients handed over are ``handover``'s (the data plane's); None: the
        plane is gone (retired at the hand-off, or closed) and nothing is in flight any more."""
        if isinstance(self.handover, Handover):
            self.handover.claims = None
        self.handover = handover if handover is not None else Settled()
        if handover is not None:
            handover.claims = self

    def pending(self, i: int) -> bool:
        """Whether an action of the user's (a step, a zero_grad()) waits to be applied to parameter ``i``."""
        return i in self.queue

    def snapshot(self) -> Snapshot:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        return Snapshot(groups, {name: getattr(self.optimizer, name) for name in SCALING
                                 if getattr(self.optimizer, name, None) is not None})

    def _enqueue(self, i: int, action: Action) -> None:
        grad = self.params[i].grad  # whatever .grad becomes meanwhile
        if isinstance(action, Snapshot) and grad is not None and not isinstance(grad, InFlightGrad):
            # a gradient nothing watches (the user's own, or reduced and seen) stepped behind an action
            # still queued: its values now, as step() would read them (p.grad.zero_() may follow)
            grad = grad.detach().clone()
        self.queue.setdefault(i, []).append((action, grad))

    def request_step(self, indices: Sequence[int], snapshot: Snapshot) -> None:
        """Queue a step with ``snapshot`` for ``indices``; apply at once those this thread can
        apply without waiting (reduced and ended, or settled already, or a gradient of the user's
        own) and with nothing queued before: on NCCL a gradient is resolved once queued, and an
        update applied now would put the next forward pass's every kernel behind every reduction
        (the Dependency Proxy lost)."""
        now = []
        for i in indices:
            if i not in self.queue and self.ready_now(i):
                now.append(i)
            else:
                self._enqueue(i, snapshot)
        self.handover.settle(now)
        self.apply_now(now, snapshot)

    def ready_now(self, i: int) -> bool:
        """Gradient ``i`` (what ``.grad`` holds now) may be used now without waiting for the device."""
        if not self.handover.holds(i):  # not a gradient handed over: the user's own, or none
            return True
        handover = self.handover
        return handover.ended(i) if i in handover.unsettled else not handover.in_flight(i)

    def request_zero(self, set_to_none: bool) -> None:
        """``zero_grad()``: ``.grad`` None at once with ``set_to_none`` (a queued step keeps the
        gradient it works on, and the reduction its buffer); zeroed in place once reduced and
        stepped without (the memory is the reduction's until then)."""
        now = []
        for i in range(len(self.params)):
            if i in self.queue or not self.ready_now(i):
                if set_to_none:
                    self.params[i].grad = None
                else:
                    self._enqueue(i, set_to_none)
            else:
                now.append(i)
        self.handover.settle(now)  # at once: on CUDA one stream wait per message, not per gradient
        for i in now:
            clear_grad(self.params[i], set_to_none)

    def touch(self, i: int) -> None:
        """Code is about to operate on gradient ``i`` as handed over (a read, an in-place change):
        its reduction first, and what the user called before on it."""
        self.wait_and_apply([i], f"the gradient of {self.names[i]!r}")

    def wait_and_apply(self, indices: Sequence[int], what: str) -> None:
        """Wait for the reductions of ``indices``, then apply everything pending and reduced."""
        started = time.perf_counter()
        indices = list(indices)
        self.handover.wait(indices, what)  # reduced, and settled: on CUDA the current stream waits for them
        if self.trace:
            self.trace.span("wait", what, started, time.perf_counter())
        self.apply(sorted(i for i in self.queue if not self.handover.in_flight(i)))

    def apply(self, indices: Sequence[int]) -> None:
        """Apply the queues of ``indices`` (settled first), in the order the user called: one
        action of each parameter at a time, the steps of one snapshot together."""
        self.handover.settle(indices)
        indices = [i for i in indices if i in self.queue]
        if not indices:
            return
        left = {i: self.params[i].grad for i in indices}  # .grad as the user left it
        try:
            while indices:
                steps: dict[int, tuple[Snapshot, list[int]]] = {}
                for i in indices:
                    action, grad = self.queue[i].pop(0)
                    self.params[i].grad = plain(grad)
                    if isinstance(action, Snapshot):
                        steps.setdefault(id(action), (action, []))[1].append(i)
                    else:
                        clear_grad(self.params[i], action)
                for snapshot, members in steps.values():
                    self.apply_now(members, snapshot)
                indices = [i for i in indices if self.queue[i]]
        finally:
            for i, grad in left.items():
                del self.queue[i]
                self.params[i].grad = plain(grad)  # (unmarked: nothing waits for it now)
                self.handover.release(i)

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
