"""What the data plane asks of the device its gradients live on (:class:`Device`), and the small
records every device shares.

Work on a device is ordered by *streams*: each thread of gradsched runs its tensor work on
its thread's current stream, and streams meet only through *events*. What gradsched needs
from a device is:

* an event on the calling thread's current stream (:meth:`Device.record`), and where a
  gradient was produced (:meth:`Device.produced`);
* the calling thread's current stream made to wait for events (:meth:`Device.wait_for`: on
  the device, not the host, where the device has streams; the host itself where it has none);
* whether the device has run past an event (:meth:`Device.passed`);
* a stream of the calling thread's own while a block runs (:meth:`Device.own_stream`);
* memory allocated on one stream and used on another kept from the next allocation until that
  use has run (:meth:`Device.used_here`);
* a collective started on a process group (:meth:`Device.issue`), whose future completes
  when the backend says so: on gloo once the result is in place, on NCCL once the
  collective is *queued* (its values are then in place only behind the future's events,
  which :meth:`torch.futures.Future.wait` makes the caller's stream wait for);
* work that must run at its place in a group's order, with the host waiting for it
  (:meth:`Device.run`: the link probe, gathering a checkpoint);
* the training thread's timestamps in device time where the host runs ahead of the device
  (:meth:`Device.timed_event`, :meth:`Device.seconds_between`, :meth:`Device.fence`: the
  clock of :mod:`gradsched.runtime.planning.clock`).

Every read or write of a buffer a collective uses must be ordered after that collective:
through the collective's future (``wait()``, or a ``then`` callback) or an event recorded
behind it. :mod:`~gradsched.runtime.device.emulated` makes a missing order give wrong values
on CPU, on purpose.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Iterable, NamedTuple, Protocol, Sequence, TypeVar

import torch

T = TypeVar("T")


class Produced(NamedTuple):
    """Where a gradient was produced: an event on that stream, and the order it was recorded in."""

    stream: int  # a key of the stream (its device and id)
    order: int
    event: Any


def latest_per_stream(produced: Iterable[Produced | None]) -> list[Any]:
    """The events a consumer must wait for to see everything ``produced`` marks: the latest of
    each stream (events of one stream complete in the order they were recorded)."""
    latest: dict[int, Produced] = {}
    for p in produced:
        if p is not None and (p.stream not in latest or p.order > latest[p.stream].order):
            latest[p.stream] = p
    return [p.event for p in latest.values()]


def future_of(started: Any) -> torch.futures.Future:
    """The future of what a collective's start returned: a ``dist.Work``'s, or the future itself."""
    get = getattr(started, "get_future", None)
    return get() if get is not None else started


class Device(Protocol):
    name: str  # for messages: "cpu", "cuda:0", "emulated NCCL"
    ordered: bool  # messages end in launch order, known by events (CUDA, the emulation); else in callbacks
    #: whether sharding's phases may travel as point-to-point operations (gloo on the host: faster there
    #: than gloo's collectives); else as the backend's own collectives, as on NCCL (CUDA, the emulation)
    point_to_point: bool

    def record(self) -> Any:
        """An event on the calling thread's current stream (None: nothing to order)."""

    def produced(self, event: Any = None, written: torch.Tensor | None = None) -> Produced | None:
        """Where work the calling thread queued so far was produced (``event``: recorded there
        already), or None where there is nothing to wait for; ``written``: the tensor that work
        wrote (a gradient handed over), readable by another stream only behind it."""

    def wait_for(self, events: Iterable[Any]) -> int:
        """The calling thread's current stream waits for each distinct event; the waits queued."""

    def passed(self, event: Any) -> bool:
        """Whether the device has run past ``event`` (raises what failed before it)."""

    def used_here(self, tensor: torch.Tensor) -> None:
        """``tensor``, allocated on another stream, was used by the calling thread's current
        stream: its memory is not handed to another allocation until that stream has run past
        what it queued so far (CUDA's ``record_stream``; nothing where the calling thread's
        work is done when issued)."""

    def own_stream(self, role: str) -> ContextManager[Any]:
        """Run the calling thread under a stream of gradsched's own for ``role`` ("launcher",
        "completion") until the block ends; yields the stream (None where there are none)."""

    def issue(self, group: Any, start: Callable[[], Any]) -> Any:
        """Start a collective on ``group`` (``start`` issues it asynchronously and returns its
        ``dist.Work`` or a future); its future, with the backend's completion semantics."""

    def issue_each(self, group: Any, start: Callable[[], Sequence[Any]], count: int) -> list[Any]:
        """:meth:`issue` for a ``start`` that issues ``count`` operations at once (a transport's
        send of a message's buffers) and returns their works or futures; one future each."""

    def run(self, group: Any, action: Callable[[], T]) -> T:
        """Run ``action`` (which issues on ``group`` and waits on the host) at its place in
        ``group``'s order, after what was issued on it before; its result."""

    def timed_event(self) -> Any:
        """An event on the calling thread's current stream that times intervals (None where the
        host's clock is the device's: the host, the emulation); it also marks where work was
        produced (:meth:`produced`)."""

    def seconds_between(self, first: Any, second: Any) -> float:
        """Seconds from timed event ``first`` to ``second`` (waits for ``second``)."""

    def fence(self) -> None:
        """Wait until the device has run everything queued (nothing where the host is the device)."""

    def close(self) -> None:
        """Nothing more will be issued by the data plane: let go of the threads of its groups
        (the device stays usable for its clock)."""


class HostTimed:
    """The clock part of a device whose host clock is the device's (the host, the emulation):
    no timed events, nothing to wait for."""

    def timed_event(self) -> None:
        return None

    def seconds_between(self, first: Any, second: Any) -> float:
        raise TypeError(f"{type(self).__name__} times with the host's clock: it records no timed events")

    def fence(self) -> None:
        """Nothing queued anywhere but on the host."""
