"""Gradients still on the wire, as the user's code sees them.

gradsched does not wait at the end of ``backward()``: a gradient may still be being reduced
when the next line of the training script runs. So that no code ever computes on a partial
sum, every gradient handed to the exchange is left in ``param.grad`` as an
:class:`InFlightGrad`: the same memory, but any torch operation on it (``clip_grad_norm_``,
``GradScaler.unscale_``, ``grad.norm()``, printing it) first waits for that gradient's
reduction. Once the training thread has seen the reduction complete, ``param.grad`` is the
plain tensor again, so the optimizer and later reads pay nothing.

Gradient clipping by value is deferred the same way: each gradient is clamped when its
reduction is first seen complete (:meth:`Handover.clip_value`), not waited for at once.

The mark stays after the reduction while the user's optimizer has a step (or a
``zero_grad()``) still to apply to that gradient (:class:`Claims`, the deferred updates): an
operation on it then applies those first, so that code running between ``step()`` and the
next forward pass sees the gradient as DDP leaves it.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Protocol, Sequence

import torch

from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.device import Produced
from gradsched.runtime.torch_private import plain_torch_function, tree_map


class InFlightGrad(torch.Tensor):
    """A gradient whose reduction may not be complete; any operation on it waits for it."""

    _gradsched_plain: torch.Tensor
    _gradsched_wait: Callable[[], None]

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        def plain(x: Any) -> Any:
            if isinstance(x, InFlightGrad):
                x._gradsched_wait()
                return x._gradsched_plain
            return x

        args, kwargs = tree_map(plain, (args, kwargs or {}))
        with plain_torch_function():
            return func(*args, **kwargs)


def plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor under an :class:`InFlightGrad` (without waiting), or ``t`` itself."""
    return t._gradsched_plain if isinstance(t, InFlightGrad) else t


class Claims(Protocol):
    """What still waits to be done to a handed-over gradient once it is reduced (the deferred
    updates: :class:`gradsched.runtime.training.updates.DeferredUpdates`)."""

    def pending(self, i: int) -> bool:
        """Whether an action of the user's still waits to be applied to gradient ``i``: its mark
        stays until then."""

    def touch(self, i: int) -> None:
        """Code operates on gradient ``i``'s mark: wait for its reduction and apply what waits."""


class Settled:
    """The handover where no data plane reduces (after the hand-off DDP's reducer reduces inside
    ``backward()``): every gradient is plain, nothing is in flight, nothing waits."""

    unsettled: frozenset[int] = frozenset()

    def holds(self, i: int) -> bool:
        return False

    def in_flight(self, i: int) -> bool:
        return False

    def ended(self, i: int) -> bool:
        return True

    def wait(self, indices: Sequence[int], what: str) -> None:
        """Nothing to wait for."""

    def settle(self, indices: Sequence[int]) -> None:
        """Nothing to settle."""

    def release(self, i: int) -> None:
        """Nothing marked."""


class Handover:
    """Puts handed-over gradients in ``param.grad`` as :class:`InFlightGrad` and turns them
    back into plain tensors, applying any deferred value clipping, once reduced (and once
    nothing the :class:`Claims` hold waits for them)."""

    def __init__(self, params: Sequence[torch.Tensor], exchange: Exchange) -> None:
        self.params = list(params)
        self.exchange = exchange
        self.claims: Claims | None = None
        self.marked: dict[int, InFlightGrad] = {}  # parameter -> the mark its handed-over gradient carries
        self.clamps: dict[int, float] = {}  # parameter -> clip value, applied once reduced
        self.scales: dict[int, float] = {}  # parameter -> factor, applied once reduced (before clamping)
        self.kept: dict[int, torch.Tensor] = {}  # parameter -> the value its .grad gets back once reduced
        self.added: dict[int, torch.Tensor] = {}  # parameter -> what its .grad adds once reduced (sharded:
        #   the averaged shard a backward pass accumulates onto)
        self.unsettled: set[int] = set()  # handed over, and this thread not yet ordered after the reduction
        # what .grad is once reduced, from the parameter's index and the tensor handed over
        # (None: that tensor; sharded: a DTensor of this rank's shard of the average)
        self.reduced_grad: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        self._warned_create_graph = False

    def place(self, grad: torch.Tensor, home: torch.Tensor | None) -> torch.Tensor:
        """Where the gradient backward just produced is handed over from: moved into its home
        (its place in the plan's flat buffer) if it has one. Under
        ``backward(create_graph=True)`` it is averaged as values, as with DDP (the graph
        through it is not kept)."""
        if grad.requires_grad:
            if not self._warned_create_graph:
                self._warned_create_graph = True
                warnings.warn("gradsched: backward(create_graph=True): gradients are averaged as values; the graph "
                              "through them is not kept, so higher-order gradients are not synchronized across "
                              "ranks (as with DDP)", stacklevel=5)
            grad = grad.detach()
        with torch.no_grad():
            if home is not None:
                if grad is not home:  # a fresh gradient (after zero_grad(set_to_none=True)): move it in
                    home.copy_(grad)
                    grad = home
            elif not grad.is_contiguous():
                grad = grad.contiguous()
        return grad

    def hand_over(self, i: int, grad: torch.Tensor, round_index: int, scale: float | None = None,
                  keep: torch.Tensor | None = None, produced: Produced | None = None) -> None:
        """Give the exchange gradient ``i`` (a plain tensor) and leave it in flight in ``.grad``;
        once reduced, it is multiplied by ``scale`` if given, or gets ``keep``'s value back (a
        gradient that must stay untouched, though the message reduces the memory it lives in)."""
        for table, value in ((self.scales, scale), (self.kept, keep)):
            if value is None:
                table.pop(i, None)
            else:
                table[i] = value
        if self.reduced_grad is None:
            marked = grad.as_subclass(InFlightGrad)  # the same memory: it is what .grad becomes
        else:  # .grad becomes another tensor: the mark does not keep the one handed over alive
            marked = grad.new_zeros(()).expand(grad.shape).as_subclass(InFlightGrad)
        marked._gradsched_plain = grad if self.reduced_grad is None else marked.as_subclass(torch.Tensor)
        marked._gradsched_wait = lambda: self.touch(i)
        self.params[i].grad = self.marked[i] = marked
        self.unsettled.add(i)
        self.exchange.mark_ready(i, grad, round_index, produced)

    def lend(self, i: int, tensor: torch.Tensor, round_index: int) -> None:
        """Give the exchange ``tensor`` as gradient ``i`` without touching ``.grad`` (the zeros a
        rank contributes for a gradient it has none of): its memory is the reduction's until
        settled, as a handed-over gradient's is."""
        self.unsettled.add(i)
        self.exchange.mark_ready(i, tensor, round_index)

    def in_flight(self, i: int) -> bool:
        """Whether gradient ``i`` is handed over and its reduction not complete (the exchange's)."""
        return self.exchange.in_flight(i)

    def ended(self, i: int) -> bool:
        """Whether gradient ``i``'s reduction ended, the device past it too (the exchange's)."""
        return self.exchange.ended(i)

    def holds(self, i: int) -> bool:
        """Whether ``.grad`` of parameter ``i`` is the gradient handed over, still marked."""
        marked = self.marked.get(i)
        return marked is not None and self.params[i].grad is marked

    def touch(self, i: int) -> None:
        """Code operates on gradient ``i``'s mark (:class:`InFlightGrad`): its reduction, and what
        the claims hold for it, first."""
        if self.claims is not None:
            self.claims.touch(i)
        else:
            self.wait([i], f"the gradient of {self.exchange.tensors[i].name!r}")

    def wait(self, indices: Sequence[int], what: str) -> None:
        """Block until these gradients are reduced, then settle them: the one answer on the
        training thread to "wait until this gradient is reduced" (a read of ``.grad``, a
        module's forward, ``step()``, clipping, a control point, a joined rank's round)."""
        self.exchange.wait_reduced(indices, what)  # complete, also on the device (gradsched.runtime.comm.board)
        self.settle(indices)

    def settle(self, indices: Sequence[int]) -> None:
        """These gradients are reduced and seen so: clamped or scaled if asked, plain tensors
        again once nothing claims them; on a device with streams the current stream waits for
        their reduced values first (where they are used). "Reduced" on NCCL means queued: until
        settled, neither this thread's reads nor its writes (the next backward pass accumulating)
        may touch a gradient's memory. One still in flight is left as it is."""
        indices = [i for i in indices if not self.exchange.in_flight(i)]
        self.exchange.order_after(indices)
        for i in indices:
            if i in self.unsettled:
                self.unsettled.discard(i)
                self._reduced(i)
            if i in self.marked and not (self.claims is not None and self.claims.pending(i)):
                self.release(i)

    def _reduced(self, i: int) -> None:
        """What waits for gradient ``i``'s reduction, done to the gradient handed over (whatever
        ``.grad`` holds now)."""
        marked = self.marked.get(i)
        if marked is not None and self.reduced_grad is not None:  # what operations on the mark now see too
            marked._gradsched_plain = self.reduced_grad(i, marked._gradsched_plain)
        grad = None if marked is None else marked._gradsched_plain
        kept = self.kept.pop(i, None)
        if kept is not None and grad is not None:
            grad.copy_(kept)
        added = self.added.pop(i, None)
        if added is not None and grad is not None:
            grad.add_(added)
        scale = self.scales.pop(i, None)
        if scale is not None and grad is not None:
            grad.mul_(scale)
        value = self.clamps.pop(i, None)
        if value is not None and grad is not None:
            grad.clamp_(-value, value)

    def release(self, i: int) -> None:
        """Gradient ``i`` is reduced and nothing waits for it: ``.grad``, if still the mark, the plain tensor."""
        marked = self.marked.pop(i, None)
        if marked is not None and self.params[i].grad is marked:
            self.params[i].grad = marked._gradsched_plain

    def clip_norm(self, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                  foreach: bool | None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over every gradient, once all are reduced."""
        self.wait(range(len(self.params)), "all gradients (clip_grad_norm_)")
        return torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], max_norm, norm_type,
                                              error_if_nonfinite, foreach)

    def clip_value(self, value: float) -> None:
        """Clamp every gradient to ``[-value, value]``: those reduced now, the others once
        their reduction is seen complete (those a step still claims now: after it, as under DDP)."""
        if not value >= 0:
            raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {value}")
        value = float(value)
        now = []
        for i in range(len(self.params)):
            if i in self.unsettled and self.holds(i) and not self.exchange.ended(i) and not (
                    self.claims is not None and self.claims.pending(i)):  # (ended: reduced, the device past it)
                self.clamps[i] = min(value, self.clamps.get(i, value))  # where it is settled (NCCL: queued)
            else:
                now.append(i)
        self.settle(now)  # waits for nothing: ended, or settled already
        for i in now:
            if self.params[i].grad is not None:
                self.params[i].grad.clamp_(-value, value)
