"""Emulated streams and events: what the emulated NCCL device (:mod:`gradsched.runtime.device.emulated`)
orders work with, as CUDA orders it with streams and events.

A stream is a FIFO executor on a thread of its own: work queued on it runs in order; an event
recorded on it completes once the work queued before it has run (carrying the stream's
failure, if any); ``wait_event`` makes the stream's later work run after an event. A thread
that runs under no emulated stream is on the host: what it records is complete at once.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from gradsched.runtime.errors import GradschedError

_local = threading.local()  # .stream: the calling thread's current emulated stream (absent: the host)


def current_stream() -> EmulatedStream | None:
    """The calling thread's current emulated stream (None: the host)."""
    return getattr(_local, "stream", None)


class EmulatedEvent:
    """Completes when its stream has run the work queued before it (with the stream's failure, if any)."""

    def __init__(self, stream: str = "host") -> None:
        self.stream = stream  # the name of the stream it was recorded on
        self._done = threading.Event()
        self.error: BaseException | None = None

    def _complete(self, error: BaseException | None) -> None:
        self.error = error
        self._done.set()

    def query(self) -> bool:
        """Whether it completed (raises what failed before it)."""
        if not self._done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True

    def synchronize(self, timeout_s: float) -> None:
        """The host waits until it completed (raises what failed before it, or after ``timeout_s``)."""
        if not self._done.wait(timeout_s):
            raise GradschedError(f"timed out after {timeout_s:.0f} s waiting for the emulated device: another "
                                 "rank is stuck or stopped")
        if self.error is not None:
            raise self.error


DONE = EmulatedEvent("host")  # what the host records: its work is done when issued
DONE._complete(None)


class EmulatedStream:
    """Work run in the order it was queued, on a thread of its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.error: BaseException | None = None  # the first failure: nothing runs after it
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"gradsched-emulated-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], Any]) -> None:
        self._queue.put(work)

    def wait_event(self, event: EmulatedEvent | None) -> None:
        """Work queued from now on runs after ``event`` (and fails if it failed)."""
        if event is None or event is DONE:
            return

        def wait() -> None:
            event._done.wait()
            if event.error is not None:
                raise event.error

        self._queue.put(wait)

    def record(self, event: EmulatedEvent | None = None) -> EmulatedEvent:
        """An event (``event``, or a new one) that completes once the work queued so far has run."""
        event = event if event is not None else EmulatedEvent(self.name)
        self._queue.put(event)
        return event

    def synchronize(self, timeout_s: float) -> None:
        self.record().synchronize(timeout_s)

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        _local.stream = self  # what runs here (a callback) is on this stream
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, EmulatedEvent):
                item._complete(self.error)
            elif self.error is None:
                try:
                    item()
                except BaseException as exc:  # noqa: BLE001 - the stream failed, as a device does
                    self.error = exc
            item = None  # what it refers to (a message's buffers) is not kept while the stream idles


def set_current(stream: EmulatedStream | None) -> None:
    _local.stream = stream


_shared: dict[str, EmulatedStream] = {}
_shared_lock = threading.Lock()


def shared_stream(role: str) -> EmulatedStream:
    """The process's stream for ``role`` ("launcher", "completion", "gatherer", "training", a pool
    stream of callbacks), made on first use and shared by every wrap in the process, as
    gradsched's CUDA streams are (one per device and role); one that failed is replaced."""
    with _shared_lock:
        stream = _shared.get(role)
        if stream is None or stream.error is not None:
            stream = _shared[role] = EmulatedStream(role)
        return stream
