"""How the end of a message is learned.

A transport gives one future per buffer of a message (:mod:`gradsched.runtime.comm.transport`).
The callbacks chained on them (a compressed message's cast back, the copy back into gradients
that travelled in a temporary buffer) write the results and return the tensors they wrote,
so on CUDA each future also carries the streams those writes were queued on. A message is
*finished* once every future has completed and, on CUDA, the device has executed what they
queued; only then does the launcher mark its gradients reduced
(:mod:`gradsched.runtime.comm.board`), free the credit it held and time it.

* :class:`CallbackCompletion` (CPU tensors): a future completes when its tensors hold the
  result, so the message finishes in the callback of its last future, at once. Two
  messages in flight may finish out of launch order, and the plan's credit window learns of
  the first to finish when it does.
* :class:`OrderedCompletion` (CUDA tensors): NCCL completes a future when the kernel is
  queued, not when it ran. One thread takes the messages in launch order (the order one
  stream runs them in), makes its stream wait for each of the message's futures
  (``Future.wait``), records an event there and waits until the device has passed it: that
  instant is the message's end.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Protocol, Sequence

import torch

Futures = Sequence[torch.futures.Future]
Finished = Callable[[float, "BaseException | None"], None]  # (end time, failure) of one message


class Completion(Protocol):
    def track(self, futures: Futures, finished: Finished) -> None:
        """Call ``finished`` once the message whose buffers ``futures`` reduce has ended."""

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
    """Finishes each message in the callback of its last future (CPU tensors)."""

    def track(self, futures: Futures, finished: Finished) -> None:
        def done(_: torch.futures.Future) -> None:
            finished(time.perf_counter(), _failure(futures))

        torch.futures.collect_all(list(futures)).add_done_callback(done)

    def stop(self, timeout_s: float) -> None:
        pass


class OrderedCompletion:
    """Finishes messages in launch order on a thread of its own, once the device (``device``,
    or none: the futures alone) has executed everything their futures queued."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gradsched-completion", daemon=True)
        self._thread.start()

    def track(self, futures: Futures, finished: Finished) -> None:
        self._queue.put((list(futures), finished))

    def _run(self) -> None:
        if self.device is not None:
            torch.cuda.set_device(self.device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            futures, finished = item
            try:
                for future in futures:
                    future.wait()  # on CUDA: this thread's stream waits for the future's streams
                if self.device is not None:
                    end = torch.cuda.Event()
                    end.record(torch.cuda.current_stream(self.device))
                    end.synchronize()
            except BaseException as exc:  # noqa: BLE001 - the message failed: handed to the caller
                finished(time.perf_counter(), exc)
                continue
            finished(time.perf_counter(), None)

    def stop(self, timeout_s: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)


def completion_for(device: torch.device | None, ordered: bool = False) -> Completion:
    """The completion of a rank whose gradients live on ``device`` (a CUDA device, or None);
    ``ordered`` takes the CUDA path's structure on CPU tensors too (tests use it)."""
    if device is not None or ordered:
        return OrderedCompletion(device)
    return CallbackCompletion()
