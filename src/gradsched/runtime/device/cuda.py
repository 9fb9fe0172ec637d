"""A CUDA device: streams and events.

Training runs on the training thread's current stream. Each of gradsched's communication
threads (the launcher, the completion) runs under a stream of gradsched's own
(:func:`dedicated_stream`), so that what it queues (waits for the producers of a message's
gradients, the divisions and copies of a message, the waits for its collectives) never sits
in the training stream, where every later kernel of backward and of the next forward pass
would queue behind it. The streams meet only through events:

* a gradient handed over carries an event on the stream that produced it; the launcher's
  stream waits, per message, for the latest event of each producing stream;
* a message whose results are in place carries an event on the completion's stream; a
  consumer's stream waits for it where the result is used (the forward pre-hook of a
  module, a read of ``.grad``, the optimizer's step), not the host.

**Streams of gradsched's own.** ``torch.cuda.Stream()`` hands out one of a small pool of
streams per priority, round robin, shared with the user's code and with NCCL's own
communication streams: a stream from it may be the user's (the overlap is lost where the two
queue behind each other) or NCCL's. gradsched's streams are made by the CUDA runtime itself
(non-blocking, at the highest priority), once per device and role in a process, and wrapped
as :class:`torch.cuda.ExternalStream`; only where the runtime library cannot be reached does
gradsched take high-priority pool streams, and says so once.

**One hardware queue.** With ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (common in Megatron set-ups)
every stream feeds one hardware queue: a kernel queued after a collective waits for it, so
no communication can overlap computation. :func:`overlap_warning` says so at wrap time.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch

from gradsched.runtime.device.base import Produced, future_of

T = TypeVar("T")
logger = logging.getLogger("gradsched")
_order = itertools.count()  # orders the events of one stream: later handed over, later recorded
_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit order with the legacy default stream
_streams: dict[tuple[int, str], Any] = {}  # (device index, role) -> gradsched's stream, made once per process
_lock = threading.Lock()
_warned: set[str] = set()


def overlap_warning(max_connections: str | None) -> str | None:
    """What to tell a user whose environment makes overlap impossible (None: nothing)."""
    if max_connections is not None and max_connections.strip() == "1":
        return ("gradsched: CUDA_DEVICE_MAX_CONNECTIONS=1 puts every CUDA stream in one hardware queue, so a "
                "kernel queued after a collective waits for it and no communication can overlap computation "
                "(scheduling then gains nothing over DDP); unset it, or set it to 8 or more, unless tensor "
                "parallelism in the same job needs it")
    return None


def _cudart() -> Any:
    """The CUDA runtime library this process loaded (for torch), through ctypes; None if not found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart" in line.rsplit("/", 1)[-1]})
    except OSError:
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)
            library.cudaStreamCreateWithPriority  # noqa: B018 - present, or AttributeError
            return library
        except (OSError, AttributeError):
            continue
    return None


def _made_by_the_runtime(device: torch.device) -> Any:
    """A new non-blocking stream of the highest priority, made by the CUDA runtime (not from
    torch's pool), or None."""
    library = _cudart()
    if library is None:
        return None
    least, greatest = ctypes.c_int(0), ctypes.c_int(0)
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        library.cudaDeviceGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest))
        status = library.cudaStreamCreateWithPriority(ctypes.byref(handle), ctypes.c_uint(_NON_BLOCKING), greatest)
    if status != 0 or not handle.value:
        return None
    return torch.cuda.ExternalStream(handle.value, device=device)


def dedicated_stream(device: torch.device, role: str) -> Any:
    """gradsched's stream for ``role`` on ``device``: made once per process, never handed to anyone else."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        stream = _streams.get((index, role))
        if stream is None:
            stream = _made_by_the_runtime(torch.device("cuda", index))
            if stream is None:
                stream = torch.cuda.Stream(index, priority=-1)  # torch's highest priority
                if "pool" not in _warned:
                    _warned.add("pool")
                    logger.warning("gradsched: the CUDA runtime library could not be reached to make streams of "
                                   "gradsched's own; using torch's high-priority pool streams, which code that "
                                   "asks for high-priority streams may share")
            _streams[(index, role)] = stream
        return stream


class CudaDevice:
    ordered = True
    point_to_point = False

    def __init__(self, device: torch.device, max_connections: str | None = None) -> None:
        self.device = device
        self.name = str(device)
        message = overlap_warning(max_connections)
        if message is not None and message not in _warned:
            _warned.add(message)
            warnings.warn(message, stacklevel=4)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def produced(self, event: Any = None, written: Any = None) -> Produced:
        stream = torch.cuda.current_stream(self.device)
        if event is None:
            event = torch.cuda.Event()
            event.record(stream)
        return Produced(hash((stream.device_index, stream.stream_id)), next(_order), event)

    def wait_for(self, events: Iterable[Any]) -> int:
        stream = torch.cuda.current_stream(self.device)
        seen: set[int] = set()
        for event in events:
            if event is not None and id(event) not in seen:
                seen.add(id(event))
                stream.wait_event(event)
        return len(seen)

    def passed(self, event: Any) -> bool:
        return event.query()

    def used_here(self, tensor: Any) -> None:
        tensor.record_stream(torch.cuda.current_stream(self.device))

    @contextlib.contextmanager
    def own_stream(self, role: str) -> Iterator[Any]:
        torch.cuda.set_device(self.device)
        stream = dedicated_stream(self.device, role)
        with torch.cuda.stream(stream):
            yield stream

    def issue(self, group: Any, start: Callable[[], Any]) -> Any:
        return future_of(start())  # NCCL's future carries the events of its stream

    def issue_each(self, group: Any, start: Callable[[], Sequence[Any]], count: int) -> list[Any]:
        return [future_of(started) for started in start()]

    def run(self, group: Any, action: Callable[[], T]) -> T:
        return action()  # queued in issue order on the group's stream, as everything else on it

    def timed_event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds_between(self, first: Any, second: Any) -> float:
        second.synchronize()
        return first.elapsed_time(second) / 1e3

    def fence(self) -> None:
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        pass

