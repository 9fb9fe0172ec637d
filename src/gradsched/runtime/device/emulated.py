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
  ``wait_event`` makes its later work run after an event. As CUDA's streams they belong to the
  process and its roles, not to one wrap (:func:`shared_stream`): two wrapped models share
  the launcher's, the completion's and the callbacks' pool, as gradsched's own CUDA streams
  are made once per process and role; each process group has a stream of its own.
* **Collectives.** :meth:`EmulatedNccl.issue` returns at once a future that is already
  complete; the real gloo collective runs later on the group's stream, after what the
  issuing thread's stream queued so far and no sooner than ``LATENCY`` after it was issued
  (then it takes ``DURATION`` more): it reads its buffers when it runs and writes its results
  then.
* **Futures** (:class:`EmulatedFuture`) are done at once. ``wait()`` makes the calling
  thread's stream wait for the future's event; ``then(callback)`` runs the callback behind
  that event on a pool stream, as CUDA runs a callback of a CUDA future on pool streams that
  wait for its events; ``add_done_callback`` calls at once (host work). c10's rule for the
  child future's events holds: a CUDA future records events for the devices of the tensors
  its value holds, so a callback that returns no tensor gives a child that orders nothing.
  Here such a child's event fails whatever waits for it (:class:`EmulationError`), where on a
  GPU the waiter would read the callback's results before they are written.
* **The producer.** The training thread's tensor work runs on the host when issued, but its
  stream lags: a gradient handed over (:meth:`EmulatedNccl.produced` with the tensor written)
  reads as NaN until the training stream, ``LATENCY`` later, has run past the event it
  returns. A consumer that waits for that event (a communication thread's
  :meth:`~EmulatedNccl.wait_for`, which on a GPU orders its stream's later work, here holds the
  thread until then, its tensor work being the host's) sees the gradient; one that does not
  reads NaN.
* **The caching allocator.** Memory a stream still uses must stay referenced (or protected,
  as ``record_stream`` protects it) until that stream has run past its use: on a GPU memory
  let go of is handed to the next allocation. Here a ``then`` callback given as a
  ``functools.partial`` holds its tensor arguments only weakly once ``then`` returns (on a GPU
  the host ran the callback then, queuing its work), and a collective's future holds its
  value only weakly once the collective ran (its work let go of its tensors): a tensor nothing
  else referenced when the callback runs is handed to it poisoned, NaN, as the next
  allocation's writes would leave it.
* **The host.** A thread outside :meth:`EmulatedNccl.own_stream` (the training thread) is on
  the host: its tensor work runs when it is issued (as the training stream's work is queued
  before anything the communication side queues after it), an event recorded there is
  complete, and a wait for an event blocks the thread until the event completes (as the
  training stream's later kernels wait on a GPU).

So a consumer that reads a reduced gradient without waiting for the right event, a producer
that writes into a buffer a queued collective has not read yet, a launcher that packs a
gradient without waiting for its producer, or a buffer let go of before a callback copied it
back, gets wrong values, deterministically where ``LATENCY`` is longer than what the host does
in the meantime.

What is not emulated, and in which direction it errs:

* A communication thread's own tensor work (the launcher's divisions, packing copies and
  casts) runs on the host when issued, not behind its stream's waits (except the producer's
  events, see above). gradsched issues such work only on what the host produced or inside
  ``then`` callbacks; code that needs a communication stream's wait before its own tensor work
  is not checked by this.
* ``value()`` of a future whose device work has not run yet raises :class:`EmulationError`
  (NCCL's returns at once: the buffers of a collective, still being written; a callback's
  result, which ran on the host at once): a read that skips ``wait()`` fails loudly here, and
  a callback reads its parent's value only behind the parent's event, where it is known.
* The allocator model is stricter than CUDA where a callback returns a tensor it was given
  (CUDA's child future then holds it from the host's call on; here the callback runs late):
  such a tensor must be referenced elsewhere too. Callbacks that are closures, not partials,
  are not modelled (gradsched's own are partials).
* Collectives of one group run one at a time (as on one NCCL stream); those of different
  groups overlap. A failure (a gloo error, a callback that raised) fails its stream, as a CUDA
  error does: every later event of it carries the error; a shared stream that failed is
  replaced for the next user (a process group's error is not a CUDA context's).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
import torch.distributed

from gradsched.runtime.device.base import HostTimed, Produced, future_of
from gradsched.runtime.device.emulated_streams import (DONE, EmulatedEvent, EmulatedStream, current_stream,
                                                       set_current, shared_stream)

T = TypeVar("T")
_UNKNOWN = object()
_POOL = 2  # c10's pool of streams for callbacks, as far as the emulation needs one
_turn = itertools.count()
_order = itertools.count()  # orders the producer's events: later handed over, later recorded


class EmulationError(RuntimeError):
    """Something the emulated device cannot give without the order that NCCL would require."""


# -- what a stream holds only weakly (the caching allocator's model) ----------------------------------
class _Released:
    """A tensor held weakly: itself while something else refers to its memory (the tensor, or the
    one it is a view of); once that is let go of, the memory as the next allocation leaves it
    (NaN; the largest value for integers)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.base = weakref.ref(tensor._base if tensor._base is not None else tensor)
        self.view = weakref.ref(tensor)
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self.strides, self.offset = tensor.stride(), tensor.storage_offset()

    def get(self) -> torch.Tensor:
        tensor, base = self.view(), self.base()
        if tensor is not None:
            return tensor
        if base is not None:  # the view object went; its memory is the base's, still held
            return base.as_strided(self.shape, self.strides, self.offset)
        fill = float("nan") if self.dtype.is_floating_point else torch.iinfo(self.dtype).max
        return torch.full(self.shape, fill, dtype=self.dtype)


def _weakly(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Released(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_weakly(v) for v in value)
    return value


def _strongly(value: Any) -> Any:
    if isinstance(value, _Released):
        return value.get()
    if isinstance(value, (list, tuple)):
        return type(value)(_strongly(v) for v in value)
    return value


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(map(_holds_tensors, value))
    if isinstance(value, dict):
        return any(map(_holds_tensors, value.values()))
    return False


class _ChildEvent(EmulatedEvent):
    """A ``then`` child's event: it fails what waits for it where the callback's value holds no
    tensor (c10 records no event for it: on a GPU the waiter would not be ordered at all)."""

    unordered: BaseException | None = None

    def _complete(self, error: BaseException | None) -> None:
        super()._complete(error or self.unordered)


class EmulatedFuture:
    """A collective's future as NCCL gives it: complete on the host at once, its values in place
    only behind :attr:`event`."""

    def __init__(self, device: EmulatedNccl) -> None:
        self.device = device
        self.event: EmulatedEvent = DONE
        self._value: Any = _UNKNOWN
        self._weak = False  # its tensors held weakly (a collective's, once it ran)
        self._error: BaseException | None = None

    def done(self) -> bool:
        return True

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        if self._value is _UNKNOWN:
            raise EmulationError("the value of a future was read before the device work that makes it had run, "
                                 "without wait(): on NCCL this reads results that are still being written")
        return _strongly(self._value) if self._weak else self._value

    def wait(self) -> Any:
        """The calling thread's stream waits for the event (the host: until it completed); the value
        where it is known."""
        self.device.wait_for([self.event])
        if current_stream() is None:
            return self.value()
        return None if self._value is _UNKNOWN else self.value()

    def then(self, callback: Callable[[EmulatedFuture], Any]) -> EmulatedFuture:
        return self.device.then(self, callback)

    def add_done_callback(self, callback: Callable[[EmulatedFuture], Any]) -> None:
        callback(self)


def _waited(real: Any) -> Any:
    """The value of the real gloo operation behind an emulated collective, once it completed: its
    future's; a work gloo gives no future for (its ``reduce_scatter_tensor``, which NCCL's
    path takes here) is waited for itself, its value the empty list."""
    if isinstance(real, torch.distributed.Work):
        try:
            real = real.get_future()
        except RuntimeError:  # "not implemented" (the operation itself failed raises at wait())
            real.wait()
            return []
    return future_of(real).wait()


def _released_arguments(callback: Callable) -> Callable:
    """``callback`` holding the tensors among its arguments only weakly, where it is a
    ``functools.partial`` (see the module's docstring: the caching allocator)."""
    if not isinstance(callback, functools.partial):
        return callback
    func, args, keywords = callback.func, _weakly(callback.args), {k: _weakly(v) for k, v in callback.keywords.items()}
    return lambda parent: func(*_strongly(args), *(parent,), **{k: _strongly(v) for k, v in keywords.items()})


class EmulatedNccl(HostTimed):
    """The emulated device (see the module's docstring)."""

    ordered = True
    point_to_point = False
    name = "emulated NCCL"

    def __init__(self, latency_s: float = 0.02, duration_s: float = 0.0, timeout_s: float = 300.0) -> None:
        self.latency_s = latency_s  # a collective runs no sooner than this after it was issued
        self.duration_s = duration_s  # ... and takes this long on its stream, besides gloo's own time
        self.timeout_s = timeout_s  # the host waits no longer for an event
        self.log: collections.deque = collections.deque(maxlen=100_000)  # (stream, started, ended) of collectives
        self._groups: dict[int, tuple[Any, EmulatedStream]] = {}  # id(group) -> (group, its stream)
        self._lock = threading.Lock()

    # -- streams and events ---------------------------------------------------------------------
    def record(self) -> EmulatedEvent:
        stream = current_stream()
        return DONE if stream is None else stream.record()

    def produced(self, event: Any = None, written: torch.Tensor | None = None) -> Produced | None:
        """Where the calling thread's work so far was produced: on the host nothing to wait for;
        ``written`` (a gradient just handed over), NaN until the lagging training stream's event
        this returns."""
        if written is None or not written.is_floating_point() or written.numel() == 0:
            return None
        training = shared_stream("training")
        values = written.detach().clone()
        with torch.no_grad():
            written.fill_(float("nan"))
        not_before = time.monotonic() + self.latency_s

        def produce() -> None:
            pause = not_before - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with torch.no_grad():
                written.copy_(values)

        training.submit(produce)
        return Produced(id(training), next(_order), training.record())

    def wait_for(self, events: Iterable[Any]) -> int:
        stream, seen = current_stream(), set()
        for event in events:
            if event is None or event is DONE or id(event) in seen:
                continue
            seen.add(id(event))
            if stream is None or event.stream == "training":  # (the latter: see the producer, above)
                event.synchronize(self.timeout_s)
            if stream is not None:
                stream.wait_event(event)
        return len(seen)

    def passed(self, event: Any) -> bool:
        return event is None or event.query()

    def used_here(self, tensor: torch.Tensor) -> None:
        """Nothing: gradsched calls this from the training thread, which is the host here (its
        work ran when issued)."""

    @contextlib.contextmanager
    def own_stream(self, role: str) -> Iterator[EmulatedStream]:
        stream = shared_stream(role)
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
                    future._value, future._weak = _weakly(_waited(real)), True  # (its work lets go)
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
        stream = shared_stream(f"pool{next(_turn) % _POOL}")
        stream.wait_event(parent.event)
        child = EmulatedFuture(self)
        event = _ChildEvent(stream.name)
        callback = _released_arguments(callback)

        def call() -> None:
            try:
                child._value = callback(parent)
            except BaseException as exc:
                child._error = exc
                raise
            if not _holds_tensors(child._value):
                event.unordered = EmulationError(
                    "a then() callback returned no tensor: on CUDA its future records no event (c10 records them "
                    "for the devices of the tensors its value holds), so waiting for it orders nothing; return the "
                    "tensors it wrote")

        stream.submit(call)
        child.event = stream.record(event)
        return child

    def close(self) -> None:
        """The groups' streams stop; the process's own (launcher, completion, pool, training) stay."""
        with self._lock:
            streams = [s for _, s in self._groups.values()]
            self._groups.clear()
        for stream in streams:
            stream.close()
