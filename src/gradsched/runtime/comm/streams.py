"""CUDA streams and events of the data plane (every function does nothing on CPU).

Training runs on the training thread's current stream. Each of gradsched's communication
threads (the launcher, the completion) runs under a stream of its own
(:func:`own_stream`), so that what it queues (waits for the producers of a message's
gradients, the divisions and copies of a message, the waits for its collectives) never sits
in the training stream, where every later kernel of backward and of the next forward pass
would queue behind it.

The streams meet only through events:

* a gradient handed over carries an event on the stream that produced it
  (:class:`Produced`); the launcher's stream waits, per message, for the latest event of
  each producing stream (:func:`latest_per_stream`): one wait per producer stream, not
  one per gradient;
* a message whose results are in place carries an event on the completion's stream; a
  consumer's stream waits for it where the result is used (:func:`wait_for`): the forward
  pre-hook of a module, a read of ``.grad``, the optimizer's step, not the host.

Memory that crosses streams stays owned by the side that allocated it until the host has
seen the consuming work finish (the board's ``finished`` point): gradients and flat buffers
are the training thread's, the collectives' inputs are kept by the backend until their work
ends.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterable, Iterator, NamedTuple

import torch

_order = itertools.count()  # orders the events of one stream: later handed over, later recorded


class Produced(NamedTuple):
    """Where a gradient was produced: an event on that stream, and the order it was recorded in."""

    stream: int  # the stream's id (torch.cuda.Stream.stream_id) and device, as one key
    order: int
    event: Any  # torch.cuda.Event


def produced_here(device: torch.device | None, event: Any = None) -> Produced | None:
    """An event on the current stream of ``device`` (``event`` if given, recorded there
    already: the clock's stamp), or None on CPU."""
    if device is None:
        return None
    stream = torch.cuda.current_stream(device)
    if event is None:
        event = torch.cuda.Event()
        event.record(stream)
    return Produced(hash((stream.device_index, stream.stream_id)), next(_order), event)


def latest_per_stream(produced: Iterable[Produced | None]) -> list[Any]:
    """The events a consumer must wait for to see everything ``produced`` marks: the latest of
    each stream (events of one stream complete in the order they were recorded)."""
    latest: dict[int, Produced] = {}
    for p in produced:
        if p is not None and (p.stream not in latest or p.order > latest[p.stream].order):
            latest[p.stream] = p
    return [p.event for p in latest.values()]


def wait_for(device: torch.device | None, events: Iterable[Any]) -> int:
    """The current stream of ``device`` waits (on the device, not the host) for each distinct
    event; the number of waits queued."""
    if device is None:
        return 0
    stream = torch.cuda.current_stream(device)
    seen: set[int] = set()
    for event in events:
        if event is not None and id(event) not in seen:
            seen.add(id(event))
            stream.wait_event(event)
    return len(seen)


def record(device: torch.device | None) -> Any:
    """An event on the current stream of ``device`` (None on CPU)."""
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


@contextlib.contextmanager
def own_stream(device: torch.device | None) -> Iterator[Any]:
    """Run the calling thread under a new stream of ``device`` (its current stream until the
    block ends; nothing on CPU). Yields the stream (None on CPU)."""
    if device is None:
        yield None
        return
    torch.cuda.set_device(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        yield stream


def is_default(stream: Any) -> bool:
    """Whether ``stream`` is its device's default stream (the GPU check asserts it is not)."""
    return stream is not None and stream == torch.cuda.default_stream(stream.device)
