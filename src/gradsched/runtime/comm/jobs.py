"""Jobs the training thread gives the launcher: operations that must travel on the data group
besides gradients (buffer broadcasts, the link probe), each run at a point of the data group's
order that every rank shares (:mod:`gradsched.runtime.comm.launcher`).

A job runs before the first message of the round that had not begun on this rank when it was
queued: the training thread queues jobs and hands gradients over, so that round is the same
on every rank however far behind the launcher thread is. The queue is read and changed under
the board's lock.

On a device with streams a job is ordered like any other work that crosses threads: the
launcher's stream first waits for what the training thread's stream queued before it asked
(``queued``, an event), and the thread that asks for the outcome has its stream wait for
what the job queued on the launcher's (``finished``). A collective the job starts is waited
for through its own future.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gradsched.runtime.device import Device
from gradsched.runtime.errors import GradschedError


@dataclass
class Job:
    run: Callable[[], Any]
    before: int  # the round it runs before: the first not begun on this rank when it was queued
    device: Device
    queued: Any = None  # the asking thread's stream when it asked (an event; None: nothing to order)
    finished: Any = None  # the launcher's stream once the job ran
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def execute(self) -> None:
        """Run it (on the launcher thread, outside the lock); what it raised goes to its caller."""
        try:
            self.device.wait_for([self.queued])
            self.result = self.run()
            self.finished = self.device.record()
        except BaseException as exc:  # noqa: BLE001 - raised on the thread that asked
            self.error = exc

    def outcome(self, timeout_s: float, failed: Callable[[], BaseException | str | None]) -> Any:
        """Wait for it: its result, the calling thread's stream ordered after what it queued
        (raises what it raised, or if ``failed`` says why it cannot run)."""
        deadline = time.monotonic() + timeout_s
        while not self.done.wait(0.1):
            why = failed() or ("it timed out" if time.monotonic() > deadline else None)
            if why:
                raise GradschedError(f"the communication thread could not run "
                                     f"{getattr(self.run, '__name__', self.run)}: {why}")
        if self.error is not None:
            raise self.error
        self.device.wait_for([self.finished])
        return self.result


class Jobs:
    def __init__(self) -> None:
        self._queue: list[Job] = []

    def add(self, run: Callable[[], Any], latest_begun: int, device: Device) -> Job:
        """Queue ``run`` (on the asking thread, which the job is ordered after on ``device``)."""
        job = Job(run, latest_begun + 1, device, device.record())
        self._queue.append(job)
        return job

    def due(self, round_index: int) -> Job | None:
        """The next job to run before round ``round_index`` begins here, taken off the queue."""
        if self._queue and self._queue[0].before <= round_index:
            return self._queue.pop(0)
        return None

    def waiting(self, round_index: int) -> bool:
        return bool(self._queue) and self._queue[0].before <= round_index

    def fail_all(self) -> None:
        """The thread ends: every job not run fails."""
        for job in self._queue:
            job.error = job.error or GradschedError("gradient communication has stopped")
            job.done.set()
        self._queue.clear()
