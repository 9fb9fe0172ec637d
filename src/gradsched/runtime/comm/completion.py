"""How the end of a message is learned: first that its results are in place, then that it ended.

A transport gives one future per buffer of a message (:mod:`gradsched.runtime.comm.transport`).
The callbacks chained on them (a compressed message's cast back, the copy back into gradients
that travelled in a temporary buffer) write the results and return the tensors they wrote,
so on CUDA each future also carries the streams those writes were queued on. Two moments of
a message matter, and a completion reports both, in this order:

* *resolved* (``resolved(event)``): a consumer that waits for ``event`` (None on CPU) sees
  the results. The launcher marks the message's gradients reduced on the board
  (:mod:`gradsched.runtime.comm.board`); a consumer's stream then waits for the event where
  it uses them (:meth:`gradsched.runtime.device.base.Device.wait_for`), and the host never waits
  for the device to get there;
* *finished* (``finished(now, error)``): the message ended (on CUDA: the device has run it).
  The credit it held is freed and its time fed to the link estimate.

* :class:`CallbackCompletion` (CPU tensors): a future completes when its tensors hold the
  result, so the message is resolved and finished in the callback of its last future, at
  once. Two messages in flight may finish out of launch order, and the plan's credit window
  learns of the first to finish when it does.
* :class:`OrderedCompletion` (a device with streams: CUDA, or NCCL's semantics emulated on
  CPU): NCCL completes a future when the kernel is queued, not when it ran. One thread, under
  a stream of its own, takes the messages in launch order (the order one stream runs them
  in), makes its stream wait for each of the message's futures (``Future.wait``: a wait on the
  device), records an event there and resolves the message with it: nothing waits on the
  host. A second thread waits on the host until the device has passed each event, in the same
  order: that instant is the message's end.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Protocol, Sequence

import torch

from gradsched.runtime.device import Device
from gradsched.runtime.errors import GradschedError

Futures = Sequence[torch.futures.Future]
Resolved = Callable[[Any], None]  # a message's results are in place, behind this event (None on CPU)
Finished = Callable[[float, "BaseException | None"], None]  # (end time, failure) of one message


class Completion(Protocol):
    def track(self, futures: Futures, resolved: Resolved, finished: Finished) -> None:
        """Call ``resolved`` once the results of the message whose buffers ``futures`` reduce
        are in place, then ``finished`` once it has ended (only ``finished``, with the
        error, if it failed)."""

    def stop(self, timeout_s: float) -> None:
        """Nothing more will be tracked; finish what was (up to ``timeout_s``)."""


def _failure(futures: Futures) -> BaseException | None:
    for future in futures:
        try:
            future.value()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            return exc
    return None


class CallbackCompletion:
    """Resolves and finishes each message in the callback of its last future (CPU tensors)."""

    def track(self, futures: Futures, resolved: Resolved, finished: Finished) -> None:
        def done(_: torch.futures.Future) -> None:
            failure = _failure(futures)
            if failure is None:
                resolved(None)
            finished(time.perf_counter(), failure)

        torch.futures.collect_all(list(futures)).add_done_callback(done)

    def stop(self, timeout_s: float) -> None:
        pass


class OrderedCompletion:
    """Resolves messages in launch order on a thread (and stream) of its own, and finishes
    them on another once ``device`` has run them."""

    def __init__(self, device: Device, timeout_s: float = float("inf")) -> None:
        self.device = device
        self.timeout_s = timeout_s  # a message the device has not run by then failed (NCCL: its watchdog is later)
        self.streams: list[Any] = []  # the stream each thread ran under (None on CPU): the GPU check reads them
        self._queue: queue.Queue = queue.Queue()
        self._ended: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._resolve, name="gradsched-completion", daemon=True),
                         threading.Thread(target=self._finish, name="gradsched-completion-end", daemon=True)]
        for thread in self._threads:
            thread.start()

    def track(self, futures: Futures, resolved: Resolved, finished: Finished) -> None:
        self._queue.put((list(futures), resolved, finished))

    def _resolve(self) -> None:
        with self.device.own_stream("completion") as stream:
            self.streams.append(stream)
            while True:
                item = self._queue.get()
                if item is None:
                    self._ended.put(None)
                    return
                self._resolve_one(*item)
                item = None  # nothing of a message is kept while this thread waits for the next

    def _resolve_one(self, futures: Futures, resolved: Resolved, finished: Finished) -> None:
        try:
            for future in futures:
                future.wait()  # on CUDA: this thread's stream waits for the future's streams
            end = self.device.record()  # behind every future's work (None: the futures were all)
        except BaseException as exc:  # noqa: BLE001 - the message failed: handed to the caller
            self._ended.put((None, finished, exc))
            return
        resolved(end)
        self._ended.put((end, finished, None))

    def _finish(self) -> None:
        while True:
            item = self._ended.get()
            if item is None:
                return
            end, finished, error = item
            item = None
            if error is None and end is not None:
                try:
                    error = self._until_passed(end)
                except BaseException as exc:  # noqa: BLE001 - the device failed: handed to the caller
                    error = exc
            finished(time.perf_counter(), error)
            end = finished = error = None  # nothing of a message (its round's buffers) kept while waiting

    def _until_passed(self, end: Any) -> BaseException | None:
        """Wait until the device has passed ``end`` (polled, so a collective that never ends
        fails here after ``timeout_s``, with gradsched's error, before NCCL's watchdog
        aborts the process); None, or the failure."""
        started = time.monotonic()
        pause = 5e-5
        while not self.device.passed(end):
            if time.monotonic() - started > self.timeout_s:
                return GradschedError(f"a message did not finish on the device within {self.timeout_s:.0f} s: "
                                      "another rank is stuck or stopped")
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
        return None

    def stop(self, timeout_s: float) -> None:
        self._queue.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))


def completion_for(device: Device, ordered: bool = False, timeout_s: float = float("inf")) -> Completion:
    """The completion of a rank whose gradients live on ``device``; ``ordered`` takes the CUDA
    path's structure on the host too (tests use it)."""
    if device.ordered or ordered:
        return OrderedCompletion(device, timeout_s)
    return CallbackCompletion()
