"""NCCL's completion semantics on CPU: an emulated device, for the data plane's tests.

On gloo a collective's future completes once its result is in place. On NCCL it completes
once the collective is *queued* on its communicator's stream: the values are written later,
and only work ordered behind the future's events sees them. Code that forgets such an order
passes every test on gloo and computes on partial sums on a GPU. :class:`EmulatedNccl` makes
the difference visible with CPU tensors, over the real gloo groups
(``GRADSCHED_EMULATE_NCCL=LATENCY[,DURATION]``, seconds; see
:class:`gradsched.runtime.config.Environment`):

* **Streams** are FIFO executors, a thread each (:class:`EmulatedStream`): work queued on one
  runs in order; an event recorded on it completes when the work queued before it has run;
  ``wait_event`` makes its later work run after an event.
* **Collectives.** Each process group has a stream of its own, as each NCCL communicator has.
  :meth:`EmulatedNccl.issue` returns at once a future that is already complete; the real gloo
  collective runs later on the group's stream, after what the issuing thread's stream queued
  so far and no sooner than ``LATENCY`` after it was issued (then it takes ``DURATION`` more):
  it reads its buffers when it runs and writes its results then.
* **Futures** (:class:`EmulatedFuture`) are done at once. ``wait()`` makes the calling
  thread's stream wait for the future's event; ``then(callback)`` runs the callback behind
  that event on a stream of a small pool, as CUDA runs a callback of a CUDA future on pool
  streams that wait for its events; ``add_done_callback`` calls at once (host work).
* **The host.** A thread outside :meth:`EmulatedNccl.own_stream` (the training thread) is on
  the host: its tensor work runs when it is issued (as the training stream's work is queued
  before anything the communication side queues after it), an event recorded there is
  complete, and a wait for an event blocks the thread until the event completes (as the
  training stream's later kernels wait on a GPU).

So a consumer that reads a reduced gradient without waiting for the right event, or a
producer that writes into a buffer a queued collective has not read yet, gets wrong values,
deterministically where ``LATENCY`` is longer than what the host does in the meantime.

What is not emulated, and in which direction it errs:

* A communication thread's own tensor work (the launcher's divisions, packing copies and
  casts) runs on the host when issued, not behind its stream's waits. gradsched issues such
  work only on what the host produced (complete here) or inside ``then`` callbacks; code that
  needs a communication stream's wait before its own tensor work is not checked by this.
* ``value()`` of a future whose device work has not run yet raises :class:`EmulationError`
  (NCCL's returns at once: the buffers of a collective, still being written; a callback's
  result, which ran on the host at once): a read that skips ``wait()`` fails loudly here, and
  a callback reads its parent's value only behind the parent's event, where it is known.
* Collectives of one group run one at a time (as on one NCCL stream); those of different
  groups overlap. A failure (a gloo error, a callback that raised) fails its stream, as a CUDA
  error does: every later event of it carries the error.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from gradsched.runtime.device.base import Produced, future_of
from gradsched.runtime.device.emulated_streams import DONE, EmulatedEvent, EmulatedStream, current_stream, set_current

T = TypeVar("T")
_UNKNOWN = object()


class EmulationError(RuntimeError):
    """Something the emulated device cannot give without the order that NCCL would require."""


class EmulatedFuture:
    """A collective's future as NCCL gives it: complete on the host at once, its values in place
    only behind :attr:`event`."""

    def __init__(self, device: EmulatedNccl) -> None:
        self.device = device
        self.event: EmulatedEvent = DONE
        self._value: Any = _UNKNOWN
        self._error: BaseException | None = None

    def done(self) -> bool:
        return True

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        if self._value is _UNKNOWN:
            raise EmulationError("the value of a future was read before the device work that makes it had run, "
                                 "without wait(): on NCCL this reads results that are still being written")
        return self._value

    def wait(self) -> Any:
        """The calling thread's stream waits for the event (the host: until it completed); the value
        where it is known."""
        self.device.wait_for([self.event])
        if current_stream() is None:
            return self.value()
        return None if self._value is _UNKNOWN else self._value

    def then(self, callback: Callable[[EmulatedFuture], Any]) -> EmulatedFuture:
        return self.device.then(self, callback)

    def add_done_callback(self, callback: Callable[[EmulatedFuture], Any]) -> None:
        callback(self)


class EmulatedNccl:
    """The emulated device (see the module's docstring)."""

    ordered = True
    name = "emulated NCCL"

    def __init__(self, latency_s: float = 0.02, duration_s: float = 0.0, timeout_s: float = 300.0,
                 pool: int = 2) -> None:
        self.latency_s = latency_s  # a collective runs no sooner than this after it was issued
        self.duration_s = duration_s  # ... and takes this long on its stream, besides gloo's own time
        self.timeout_s = timeout_s  # the host waits no longer for an event
        self.log: collections.deque = collections.deque(maxlen=100_000)  # (stream, started, ended) of collectives
        self._groups: dict[int, tuple[Any, EmulatedStream]] = {}  # id(group) -> (group, its stream)
        self._pool = [EmulatedStream(f"pool{k}") for k in range(pool)]  # where then() callbacks run
        self._turn = itertools.count()
        self._own: list[EmulatedStream] = []
        self._lock = threading.Lock()

    # -- streams and events ---------------------------------------------------------------------
    def record(self) -> EmulatedEvent:
        stream = current_stream()
        return DONE if stream is None else stream.record()

    def produced(self, event: Any = None) -> Produced | None:
        return None  # produced by the host: complete

    def wait_for(self, events: Iterable[Any]) -> int:
        stream, seen = current_stream(), set()
        for event in events:
            if event is None or event is DONE or id(event) in seen:
                continue
            seen.add(id(event))
            if stream is None:
                event.synchronize(self.timeout_s)
            else:
                stream.wait_event(event)
        return len(seen)

    def passed(self, event: Any) -> bool:
        return event is None or event.query()

    @contextlib.contextmanager
    def own_stream(self, role: str) -> Iterator[EmulatedStream]:
        stream = EmulatedStream(role)
        with self._lock:
            self._own.append(stream)
        previous = current_stream()
        set_current(stream)
        try:
            yield stream
        finally:
            set_current(previous)

    # -- collectives ------------------------------------------------------------------------------
    def stream_of(self, group: Any) -> EmulatedStream:
        """The stream of ``group``'s communicator."""
        with self._lock:
            entry = self._groups.get(id(group))
            if entry is None:
                name = getattr(group, "group_name", None) or str(len(self._groups))
                entry = self._groups[id(group)] = (group, EmulatedStream(f"nccl-{name}"))
            return entry[1]

    def issue(self, group: Any, start: Callable[[], Any]) -> EmulatedFuture:
        return self.issue_each(group, lambda: [start()], 1)[0]

    def issue_each(self, group: Any, start: Callable[[], Sequence[Any]], count: int) -> list[EmulatedFuture]:
        stream = self.stream_of(group)
        stream.wait_event(self.record())  # after what the issuing thread's stream queued so far
        futures = [EmulatedFuture(self) for _ in range(count)]
        not_before = time.monotonic() + self.latency_s

        def collective() -> None:
            pause = not_before - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            started = time.monotonic()
            try:
                for future, real in zip(futures, start(), strict=True):
                    future._value = future_of(real).wait()
            except BaseException as exc:
                for future in futures:
                    future._error = exc
                raise
            if self.duration_s:
                time.sleep(self.duration_s)
            self.log.append((stream.name, started, time.monotonic()))

        stream.submit(collective)
        end = stream.record()
        for future in futures:
            future.event = end
        return futures

    def run(self, group: Any, action: Callable[[], T]) -> T:
        self.stream_of(group).synchronize(self.timeout_s)  # what was queued on the group first
        return action()

    def then(self, parent: EmulatedFuture, callback: Callable[[EmulatedFuture], Any]) -> EmulatedFuture:
        """``callback(parent)`` behind ``parent``'s event, on a pool stream; the child future."""
        stream = self._pool[next(self._turn) % len(self._pool)]
        stream.wait_event(parent.event)
        child = EmulatedFuture(self)

        def call() -> None:
            try:
                child._value = callback(parent)
            except BaseException as exc:
                child._error = exc
                raise

        stream.submit(call)
        child.event = stream.record()
        return child

    def close(self) -> None:
        with self._lock:
            streams = [*self._pool, *self._own, *(s for _, s in self._groups.values())]
            self._own.clear()
            self._groups.clear()
        for stream in streams:
            stream.close()
