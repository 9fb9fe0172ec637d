"""The transport seam: how one message's buffers are averaged over the workers.

A transport is told *which* message it reduces (a :class:`MessageKey`: the round, the
version of the plan the round follows, the message's index in it) and gets the message's
buffers, one per dtype, holding this rank's gradients. It returns one future per buffer,
each completing once that buffer holds the average (on CUDA: a future that carries the
streams the result is written on, so a stream that waits for it sees the result). A
transport that sends before it completes (a push to parameter servers, then a pull) also
calls ``on_sent`` once this rank's part is sent; others never do, and the message counts as
sent when it completes.

Dividing by the number of workers is the transport's job, as in DDP's communication hooks:
:meth:`Transport.divide` is what a rank does to its buffers before they travel (all-reduce:
divide by the workers; parameter servers: nothing, the servers divide), and
:meth:`Transport.send` makes them travel. Compression
(:class:`gradsched.runtime.comm.compression.Compressed`) wraps any transport between the two.

:class:`AllReduce` is the default. Parameter servers have their own
(:class:`gradsched.runtime.architectures.servers.pushpull.PushPull`); the round headers servers need
live in it. Which one a rank uses its architecture says (``Architecture.transport``).

Every transport's sends go through the device (:class:`Issued`, the innermost wrapper): on the
host and on CUDA that issues them at once; with NCCL's semantics emulated on CPU
(:mod:`gradsched.runtime.device.emulated`) they run later, on the data group's stream. A
transport learns when each message has ended on the device (:meth:`Transport.finished`): only
then may memory the message read be written again.
"""

from __future__ import annotations

import queue
import threading
from functools import partial
from typing import Callable, NamedTuple, Protocol, Sequence

import torch
import torch.distributed as dist

from gradsched.runtime.device import Device

Reduced = list  # of torch.futures.Future: one per buffer, completing with the buffer's average


class MessageKey(NamedTuple):
    round: int  # the backward pass, numbered from 1
    version: int  # of the plan the round follows (see gradsched.runtime.comm.plans)
    index: int  # of the message in that plan


class Transport(Protocol):
    #: what :meth:`divide` divides every element by, where that is all it does (None: nothing, or
    #: something else): a layout that copies a message's gradients divides them as it copies
    divisor: int | None

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        """What this rank does to its buffers, in place, before they travel."""

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        """Start reducing ``buffers`` (divided already). Messages arrive in plan order, rounds
        in order, on one thread."""

    def reduce(self, key: MessageKey, buffers: Sequence[torch.Tensor],
               on_sent: Callable[[], None] | None = None) -> Reduced:
        """:meth:`divide`, then :meth:`send`."""

    def finished(self, key: MessageKey) -> None:
        """Message ``key`` has ended on the device: what it read may be reused."""

    def release(self) -> None:
        """Let go of memory kept from message to message (nothing is in flight)."""

    def close(self, wait: bool) -> None:
        """No message will follow; with ``wait``, tell peers so and wait for what is in flight."""


class BaseTransport:
    """What every transport's :meth:`Transport.reduce` is, and nothing kept between messages."""

    divisor: int | None = None

    def reduce(self, key: MessageKey, buffers: Sequence[torch.Tensor],
               on_sent: Callable[[], None] | None = None) -> Reduced:
        self.divide(buffers)
        return self.send(key, buffers, on_sent)

    def finished(self, key: MessageKey) -> None:
        pass

    def release(self) -> None:
        pass


class Issued(BaseTransport):
    """``inner``'s sends issued through ``device`` on ``group`` (see the module's docstring)."""

    def __init__(self, inner: Transport, device: Device, group: dist.ProcessGroup) -> None:
        self.inner = inner
        self.device = device
        self.group = group
        self.result_part = getattr(inner, "result_part", None)  # a reduce-scatter's (Compressed reads it)
        self.divisor = inner.divisor

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        self.inner.divide(buffers)

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        return self.device.issue_each(self.group, partial(self.inner.send, key, buffers, on_sent), len(buffers))

    def finished(self, key: MessageKey) -> None:
        self.inner.finished(key)

    def release(self) -> None:
        self.inner.release()

    def close(self, wait: bool) -> None:
        if wait:  # what was issued through the device has reached the transport (emulated NCCL: run)
            self.device.run(self.group, lambda: None)
        self.inner.close(wait)
        self.group = None


class AllReduce(BaseTransport):
    """One async all-reduce per buffer on the workers' data group, in place.

    Each buffer's future is its collective's own: it completes when the backend finishes it
    (two messages in flight may finish out of launch order), and on CUDA it carries the
    communication stream, so whoever waits for it is ordered after the reduction."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = self.divisor = dist.get_world_size(group)

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        for buffer in buffers:
            buffer.div_(self.size)

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        return [dist.all_reduce(buffer, group=self.group, async_op=True).get_future() for buffer in buffers]

    def close(self, wait: bool) -> None:
        self.group = None


class Waiter:
    """Waits, on a thread of its own, for groups of operations in the order they were
    started, and completes one future per group (with an exception if one failed): futures
    for operations whose work has none (gloo's point-to-point operations and reduce-scatter)."""

    def __init__(self, describe: Callable[[object, BaseException], BaseException] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._describe = describe
        self._thread = threading.Thread(target=self._run, name="gradsched-waiter", daemon=True)
        self._thread.start()

    def track(self, works: Sequence[dist.Work], tag: object = None, result: object = None) -> torch.futures.Future:
        """A future completed with ``result`` once every one of ``works`` completed."""
        future: torch.futures.Future = torch.futures.Future()
        self._queue.put((list(works), future, tag, result))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            works, future, tag, result = item
            try:
                for work in works:
                    work.wait()
            except Exception as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(self._describe(tag, exc) if self._describe else exc)
            else:
                future.set_result(result)
            # nothing of a finished group kept while waiting for the next: its works hold the
            # buffers they sent and received (under sharding, a message's packed gradients)
            item = works = future = tag = result = None

    def stop(self, timeout_s: float) -> None:
        """Finish what was queued, then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
