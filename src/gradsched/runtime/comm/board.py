"""The board: what the training thread and the communication side both see of each gradient.

One lock (a condition variable) guards it, and every field has one writer:

* ``ready_round``, ``grads``, ``produced`` (:class:`gradsched.runtime.device.base.Produced`): the training
  thread, when it hands a gradient over
  (:meth:`gradsched.runtime.comm.exchange.Exchange.mark_ready`);
* ``reduced_round``, ``result``: the completion side (:mod:`gradsched.runtime.comm.completion`),
  once a gradient's every slice is reduced *and its result in place*: on the host once
  written; on a device with streams once ordered behind ``result[i]``, an event on the
  completion's stream (the device may still be running it). A gradient that is not in flight
  (``reduced_round >= ready_round``) may be read or written by a stream that first waits for
  its ``result`` event (:meth:`gradsched.runtime.comm.exchange.Exchange.order_after`): this is
  the one ordering point between the reduction and everything that consumes it (updates,
  zeroing, clipping, reads of ``param.grad``); the host waits for the device only where a
  message must have *ended* (its credit, its time, close);
* ``error``: whoever fails first; ``closed``: the exchange, when it closes.

Readers wait on ``cond``, and every writer notifies it, except the wait for reductions: the
training thread waits on ``reduced`` for the gradients it adds to ``wanted``, and is woken
when one of those is reduced (not at every message's end), or when anything fails or closes,
or the launcher waits for a gradient (:meth:`wake_all`).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from gradsched.core.task import TensorSpec
from gradsched.runtime.device import Device


class Board:
    def __init__(self, tensors: Sequence[TensorSpec], like: Sequence[torch.Tensor], device: Device) -> None:
        self.tensors = list(tensors)
        self.index = {t.name: i for i, t in enumerate(self.tensors)}
        self.like = list(like)  # the parameters: shape, dtype and device of each gradient
        self.cond = threading.Condition()
        self.reduced = threading.Condition(self.cond)  # on the same lock: the wait for ``wanted``'s reductions
        self.wanted: list[set[int]] = []  # per waiter on ``reduced``, the gradients it waits for
        n = len(self.tensors)
        self.ready_round = [0] * n  # last round in which the gradient was handed over
        self.reduced_round = [0] * n  # last round whose reduction of it is complete
        self.grads: list[torch.Tensor | None] = [None] * n
        self.held_bytes = 0  # bytes of the gradients in ``grads`` (handed over, not let go of yet)
        self.packed_bytes = 0  # bytes of messages packed into copies and not yet ended (the launcher's)
        self.produced: list[Any] = [None] * n  # where the gradient was produced (device.Produced; None: the host)
        self.result: list[Any] = [None] * n  # the event its reduced value is ordered behind (None: none)
        self.error: BaseException | None = None
        self.closed = False
        self.device = device  # where the gradients live, and how work on them is ordered

    def hold(self, i: int, grad: torch.Tensor | None) -> None:
        """``grads[i] = grad``, counted in ``held_bytes``."""
        old = self.grads[i]
        self.held_bytes += (0 if grad is None else grad.nbytes) - (0 if old is None else old.nbytes)
        self.grads[i] = grad

    def let_go_of_all(self) -> None:
        self.grads = [None] * len(self.grads)
        self.held_bytes = self.packed_bytes = 0

    @property
    def outstanding_bytes(self) -> int:
        """What this rank holds for gradients not yet reduced: handed over, or packed and in flight."""
        return self.held_bytes + self.packed_bytes

    def ready(self, i: int, round_index: int) -> bool:
        """Gradient ``i`` of round ``round_index`` (or a later one) has been handed over."""
        return self.ready_round[i] >= round_index

    def in_flight(self, i: int) -> bool:
        return self.reduced_round[i] < self.ready_round[i]

    @property
    def stopping(self) -> bool:
        return self.closed or self.error is not None

    def reduced_now(self, indices: Sequence[int]) -> None:
        """Gradients ``indices`` were just reduced: the training thread is woken if it waits for one.
        Under the lock."""
        if any(not wanted.isdisjoint(indices) for wanted in self.wanted):
            self.reduced.notify_all()

    def wake_all(self) -> None:
        """Every waiter looks again (something failed, closed, or waits for a gradient). Under the lock."""
        self.cond.notify_all()
        self.reduced.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Communication failed: every waiter raises from now on."""
        with self.cond:
            if self.error is None:
                self.error = exc
            self.wake_all()
