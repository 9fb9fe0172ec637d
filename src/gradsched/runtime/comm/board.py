"""The board: what the training thread and the communication side both see of each gradient.

One lock (a condition variable) guards it, and every field has one writer:

* ``ready_round``, ``grads``, ``produced``: the training thread, when it hands a gradient over
  (:meth:`gradsched.runtime.comm.exchange.Exchange.mark_ready`);
* ``reduced_round``: the completion side (:mod:`gradsched.runtime.comm.completion`), once a
  gradient's every slice is reduced *and its result written*: on CUDA once the device has
  finished, not once the kernel was queued. A gradient that is not in flight
  (``reduced_round >= ready_round``) may therefore be read or written by any thread on any
  stream, with no further wait: this is the one ordering point between the reduction and
  everything that consumes it (updates, zeroing, clipping, reads of ``param.grad``, close);
* ``error``: whoever fails first; ``closed``: the exchange, when it closes.

Readers wait on ``cond``; every writer notifies it.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from ...core.task import TensorSpec


class Board:
    def __init__(self, tensors: Sequence[TensorSpec], like: Sequence[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        self.index = {t.name: i for i, t in enumerate(self.tensors)}
        self.like = list(like)  # the parameters: shape, dtype and device of each gradient
        self.cond = threading.Condition()
        n = len(self.tensors)
        self.ready_round = [0] * n  # last round in which the gradient was handed over
        self.reduced_round = [0] * n  # last round whose reduction of it is complete
        self.grads: list[torch.Tensor | None] = [None] * n
        self.produced: list[Any] = [None] * n  # CUDA: an event on the stream that produced the gradient
        self.error: BaseException | None = None
        self.closed = False
        self.device = next((t.device for t in self.like if t.is_cuda), None)  # a CUDA device, or None (CPU)

    def ready(self, i: int, round_index: int) -> bool:
        """Gradient ``i`` of round ``round_index`` (or a later one) has been handed over."""
        return self.ready_round[i] >= round_index

    def in_flight(self, i: int) -> bool:
        return self.reduced_round[i] < self.ready_round[i]

    @property
    def stopping(self) -> bool:
        return self.closed or self.error is not None

    def fail(self, exc: BaseException) -> None:
        """Communication failed: every waiter raises from now on."""
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()
