"""The launcher: one thread per rank that sends each round's messages as its plan says.

It walks the plan of each round in order and starts message k as soon as every earlier
message has started, its gradients are ready on this rank, and the event that released it
in the plan (a gradient becoming ready, an earlier message finishing or, with parameter
servers, being sent) has happened here too. Every rank therefore issues the same
operations in the same order: the order comes from the plan, never from local timing. A
message travels in the range of the plan's flat buffer that holds its gradients when it
has one (:mod:`gradsched.runtime.layout`), else in buffers copied together per dtype;
completion callbacks copy results back where needed, mark gradients reduced and feed the
link estimate. The launcher sleeps on the exchange's lock and is woken only when what it
waits for may have happened.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..core.estimator import CompletionTimer
from ..core.plan import Plan, PlannedMessage
from .layout import BufferLayout
from .plans import Adopted
from .transport import MessageKey, Transport

if TYPE_CHECKING:  # pragma: no cover
    from .exchange import Exchange


@dataclass
class RoundState:
    """Launch and completion progress of one round (one backward pass) on this rank."""

    index: int
    adopted: Adopted  # the plan it follows
    layout: BufferLayout
    launched: int = 0
    in_flight: int = 0
    done: list[bool] = field(default_factory=list)
    sent: list[bool] = field(default_factory=list)  # reported sent by the transport (parameter servers)
    remaining: dict[int, int] = field(default_factory=dict)  # tensor -> slices not yet reduced
    messages_of: dict[int, list[int]] = field(default_factory=dict)  # tensor -> messages carrying it
    futures: dict[int, torch.futures.Future] = field(default_factory=dict)  # message -> result ready

    @property
    def plan(self) -> Plan:
        return self.adopted.plan


@dataclass(frozen=True)
class _Copied:
    """A message whose buffers are copies: where to copy the results back to."""

    groups: list[list[torch.Tensor]]  # per buffer, the gradient views it was made of


_ANY_ROUND = "any round"  # what the launcher waits for between rounds


class Launcher:
    def __init__(self, exchange: Exchange, transport: Transport, on_event: Callable[..., None] | None) -> None:
        # The exchange owns the launcher: a weak reference back, so that no cycle keeps the
        # exchange (and through it the gradients' flat buffers) alive until a garbage collection.
        self.exchange: Exchange = weakref.proxy(exchange)
        self.transport = transport
        self.on_event = on_event  # tracing: on_event(kind, **fields), called under the lock
        self.rounds: dict[int, RoundState] = {}
        self._wake = threading.Condition(exchange.cond)  # the launcher sleeps here, on the exchange's lock
        self._waiting: object = None  # _ANY_ROUND, or (state, k, message) it waits to launch
        self._timer = CompletionTimer(exchange.estimator)
        self._thread = threading.Thread(target=self._run, name="gradsched-launcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- called by the exchange, under its lock ----------------------------------------------
    def gradient_ready(self, round_index: int) -> None:
        waiting = self._waiting
        if waiting is _ANY_ROUND or (
            waiting is not None and waiting[0].index == round_index and self._launchable(*waiting)
        ):
            self._wake.notify()

    def wake(self) -> None:
        self._wake.notify_all()

    def reduction_futures(self, indices: Sequence[int], ready_round: Sequence[int]) -> list[torch.futures.Future]:
        """The futures of the messages that carried the latest gradients of ``indices``."""
        with self.exchange.cond:
            futures: dict[tuple[int, int], torch.futures.Future] = {}
            for i in indices:
                state = self.rounds.get(ready_round[i])
                for k in state.messages_of.get(i, ()) if state else ():
                    if k in state.futures:
                        futures.setdefault((state.index, k), state.futures[k])
            return list(futures.values())

    def held_up_by(self, indices: Sequence[int]) -> list[int]:
        """If the message this thread waits to launch lacks gradients of its round, and must go
        before one that carries the latest gradient of one of ``indices``: every gradient that
        round lacks (indices); else []. Called under the exchange's lock."""
        waiting = self._waiting
        if not isinstance(waiting, tuple):
            return []
        state, k, message = waiting
        ready, index, r = self.exchange.ready_round, self.exchange.index, state.index
        needed = list(message.tensors) + ([message.after_tensor] if message.after_tensor is not None else [])
        if all(ready[index[name]] >= r for name in needed):
            return []
        for i in indices:
            if ready[i] > r or (ready[i] == r and any(m >= k for m in state.messages_of.get(i, ()))):
                return [j for j in range(len(ready)) if ready[j] < r]
        return []

    def stop(self, wait: bool) -> None:
        """End the thread; with ``wait``, wait for what is in flight; close the transport."""
        self._thread.join(timeout=5.0)
        with self.exchange.cond:
            pending = [f for state in self.rounds.values() for f in state.futures.values()]
            self.rounds.clear()
        for future in pending:
            if self.exchange.error is not None or not wait:
                break  # a failed collective: the backend's timeout ends the rest
            try:
                future.wait()
            except Exception:  # noqa: BLE001 - reported through exchange.error
                pass
        self.transport.close(wait and self.exchange.error is None)
        self.transport = None

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        round_index = 1
        try:
            cuda = next((t.device for t in self.exchange.like if t.is_cuda), None)
            if cuda is not None:  # collectives and copies of this thread go to that device
                torch.cuda.set_device(cuda)
            while True:
                state = self._begin(round_index)
                if state is None:
                    return
                for k, message in enumerate(state.plan.messages):
                    launch = self._await(state, k, message)
                    if launch is None:
                        return
                    self._launch(state, k, message, *launch)
                round_index += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the training thread
            self.exchange.fail(exc)

    def _stopping(self) -> bool:
        return self.exchange.closed or self.exchange.error is not None

    def _begin(self, round_index: int) -> RoundState | None:
        """Wait until the round has begun here, then set it up (None: stop)."""
        ex = self.exchange
        with ex.cond:
            # Choose the round's plan only once the round has begun here: a plan agreed at
            # the control point of the previous round must be in place.
            while not any(r >= round_index for r in ex.ready_round):
                if self._stopping():
                    return None
                self._waiting = _ANY_ROUND
                self._wake.wait()
            self._waiting = None
            adopted = ex.versions.for_round(round_index)
            ex.versions.forget_before(round_index)
            n = len(adopted.plan.messages)
            state = RoundState(round_index, adopted, ex.layout(adopted), done=[False] * n, sent=[False] * n)
            for k, message in enumerate(adopted.plan.messages):
                for name in message.tensors:
                    i = ex.index[name]
                    state.remaining[i] = state.remaining.get(i, 0) + 1
                    state.messages_of.setdefault(i, []).append(k)
            self.rounds[round_index] = state
            self.rounds.pop(round_index - 2, None)
            return state

    def _await(self, state: RoundState, k: int, message: PlannedMessage) -> tuple | None:
        """Wait until message ``k`` may start; take its buffers (None: stop)."""
        ex = self.exchange
        with ex.cond:
            while not self._launchable(state, k, message):
                if self._stopping():
                    return None
                self._waiting = (state, k, message)
                self._wake.wait()
            self._waiting = None
            state.launched = k + 1
            state.in_flight += 1
            idle = state.in_flight == 1
            fused = state.layout.fused.get(k)
            views = [] if fused is not None else [
                ex.grads[ex.index[name]].view(-1)[offset : offset + numel] for name, offset, numel in message.slices]
            return views, fused, idle

    def _launchable(self, state: RoundState, k: int, message: PlannedMessage) -> bool:
        ready, index, r = self.exchange.ready_round, self.exchange.index, state.index
        if any(ready[index[name]] < r for name in message.tensors):
            return False
        if message.after_tensor is not None and ready[index[message.after_tensor]] < r:
            return False
        after = message.after_message
        return after is None or state.done[after] or (message.after_sent and state.sent[after])

    def _launch(self, state: RoundState, k: int, message: PlannedMessage, views: list[torch.Tensor],
                fused: torch.Tensor | None, idle: bool) -> None:
        if fused is not None:  # the gradients already live, in order, in the message's range
            buffers, copied = [fused], None
        elif len(views) == 1:
            buffers, copied = [views[0]], None
        else:  # copied into one buffer per dtype: one operation per dtype, in a fixed order
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for view in views:
                by_dtype.setdefault(view.dtype, []).append(view)
            copied = _Copied([by_dtype[d] for d in sorted(by_dtype, key=str)])
            buffers = [torch.cat(group) for group in copied.groups]
        launched_at = time.perf_counter()
        reduced = self.transport.reduce(MessageKey(state.index, state.adopted.version, k), buffers,
                                        on_sent=lambda: self._sent(state, k))
        if self.on_event:
            self.on_event("launch", round=state.index, message=k, nbytes=message.nbytes, at=launched_at,
                          names=message.tensors)
        # then(): the returned future also covers the copies back, in CUDA stream order
        state.futures[k] = reduced.then(
            lambda future: self._finished(future, state, k, message, buffers, copied, launched_at, idle))

    def _sent(self, state: RoundState, k: int) -> None:
        with self.exchange.cond:
            state.sent[k] = True
            self._wake.notify_all()

    def _finished(self, future: torch.futures.Future, state: RoundState, k: int, message: PlannedMessage,
                  buffers: list[torch.Tensor], copied: _Copied | None, launched_at: float, idle: bool) -> None:
        now = time.perf_counter()
        try:
            for buffer, result in zip(buffers, future.value()):  # value() raises if the transport failed
                if result is not buffer:  # the average arrived in a tensor of the transport's
                    buffer.copy_(result)
            for buffer, views in zip(buffers, copied.groups if copied else ()):  # the views alias the gradients
                offset = 0
                for view in views:
                    view.copy_(buffer[offset : offset + view.numel()])
                    offset += view.numel()
        except BaseException as exc:  # noqa: BLE001
            self.exchange.fail(exc)
            return
        ex = self.exchange
        with ex.cond:
            state.done[k] = True
            state.in_flight -= 1
            self._timer.finished(message.nbytes, launched_at, idle, now)
            for name in message.tensors:
                i = ex.index[name]
                state.remaining[i] -= 1
                if state.remaining[i] == 0:
                    ex.reduced_round[i] = state.index
            if self.on_event:
                self.on_event("done", round=state.index, message=k, nbytes=message.nbytes, at=now)
            ex.cond.notify_all()
            self._wake.notify_all()
