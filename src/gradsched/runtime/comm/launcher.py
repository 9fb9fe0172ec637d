"""The launcher: the one thread of a rank that issues gradsched's collectives on the data group.

It walks the plan of each round in order, the plan-following rule of
:class:`~gradsched.core.following.RoundFollower` deciding when each message may start, so
every rank issues the same operations in the same order: the order comes from the plan,
never from local timing. A message travels in the range of the plan's flat buffer that
holds its gradients when it has one (:mod:`gradsched.runtime.comm.layout`), else in buffers
copied together per dtype. On CUDA the thread runs under a stream of its own
(:mod:`gradsched.runtime.device`), which first waits for the latest event of each
stream that produced the message's gradients: the divisions, copies and casts of a message
run there, never on the training stream.

The transport's futures get the copies back chained onto them; the completion
(:mod:`gradsched.runtime.comm.completion`) says when the message ended, and only then are
its gradients marked reduced on the board once its results are in place (resolved), the
credit it held freed and its time fed to the link estimate once it has ended (finished). Between rounds the thread also runs the few other operations that must
travel on the data group (the link probe): :meth:`Launcher.between_rounds`. It sleeps on the
board's lock and is woken only when what it waits for may have happened.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence, TypeVar

import torch

from gradsched.core.estimator import CompletionTimer, LinkEstimator
from gradsched.core.following import RoundFollower
from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.comm.board import Board
from gradsched.runtime.comm.broadcast import unflatten_into
from gradsched.runtime.comm.completion import Completion
from gradsched.runtime.comm.jobs import Job, Jobs
from gradsched.runtime.comm.layout import BufferLayout, Layouts
from gradsched.runtime.comm.plans import Adopted, PlanVersions
from gradsched.runtime.comm.transport import MessageKey, Transport
from gradsched.runtime.device import latest_per_stream

T = TypeVar("T")
logger = logging.getLogger("gradsched")


@dataclass
class RoundState:
    """One round (one backward pass) on this rank: the plan it follows and its progress."""

    index: int
    adopted: Adopted
    layout: BufferLayout
    follower: RoundFollower
    ready: Callable[[int], bool]  # whether gradient i of this round has been handed over here
    futures: dict[int, list[torch.futures.Future]] = field(default_factory=dict)  # message -> its futures
    packed: dict[int, int] = field(default_factory=dict)  # message -> bytes of the copies it travels in
    held: dict[int, list] = field(default_factory=dict)  # message -> the copies it travels in, until it ended

    def hold(self, k: int, buffers: list) -> None:
        """Keep message ``k``'s copies referenced until it has ended: on CUDA memory let go of while
        a stream still uses it (the copy back, on a stream of the callbacks' pool) is handed to the
        next allocation by the caching allocator."""
        self.held[k] = buffers

    @property
    def plan(self) -> Plan:
        return self.adopted.plan


_ANY_ROUND = "any round"  # what the launcher waits for between rounds


def _handed_over(ready_round: list[int], round_index: int, i: int) -> bool:
    """Gradient ``i`` of round ``round_index`` (or a later one) has been handed over (the
    board's ``ready_round``, read under its lock)."""
    return ready_round[i] >= round_index


def _copy_back(result: torch.Tensor, views: Sequence[torch.Tensor], future: torch.futures.Future) -> list:
    """A message that travelled in a copy: its result back where it belongs (the gradients it
    was made of; under sharding, this rank's shard of them). Returns the views it wrote: on
    CUDA a future records events for the devices of the tensors its value holds, and only those
    order a consumer after the copy (a future holding none orders nothing). Not the copy itself
    (a future can outlive its message in a thread of the backend's): the round keeps that until
    the message has ended (:meth:`RoundState.hold`)."""
    future.value()  # raises if the transport failed
    unflatten_into(views, result)
    return list(views) or [result]  # (none: this rank's share of it is empty; an event all the same)


class Launcher:
    def __init__(self, board: Board, versions: PlanVersions, layouts: Layouts, transport: Transport,
                 completion: Completion, estimator: LinkEstimator, on_event: Callable[..., None] | None) -> None:
        self.board = board
        self.versions = versions  # read under the board's lock
        self.layouts = layouts
        self.transport = transport
        self.divisor = transport.divisor  # what it divides by before sending: a copied message is packed so
        self.completion = completion
        self.on_event = on_event  # tracing: on_event(kind, **fields), called under the lock
        self.rounds: dict[int, RoundState] = {}
        self._wake = threading.Condition(board.cond)  # the launcher sleeps here, on the board's lock
        self._waiting: object = None  # _ANY_ROUND, or the RoundState whose next message it waits to launch
        self._begins = 1  # the round it begins next (what _ANY_ROUND waits for)
        self._jobs = Jobs()  # run between rounds (gradsched.runtime.comm.jobs)
        self._timer = CompletionTimer(estimator)
        self._thread = threading.Thread(target=self._run, name="gradsched-launcher", daemon=True)
        self.stream: Any = None  # the stream the thread runs under (None on CPU): the GPU check reads it
        self.copied_messages = 0  # messages that travelled in a copy (mixed dtypes, slices): the GPU check reads it
        self.copied_bytes = 0  # and their bytes (benchmarks/cpu_cost.py reads it)

    def start(self) -> None:
        self._thread.start()

    # -- called by the training thread, under the board's lock ---------------------------------
    def gradient_ready(self, round_index: int) -> None:
        waiting = self._waiting
        if waiting is _ANY_ROUND or (
            isinstance(waiting, RoundState) and waiting.index == round_index and self._launchable(waiting)
        ):
            self._wake.notify()

    def wake(self) -> None:
        self._wake.notify_all()

    def progresses_alone(self) -> bool:
        """Whether this thread will launch a message, or see one end, without another gradient
        handed over first: it is not waiting for a gradient, nor for a round to begin. Under the
        board's lock; when that changes to False the board's waiters are notified."""
        state = self._waiting
        if state is None:
            return True  # busy (launching), and it will say when it waits again
        if state is _ANY_ROUND:  # it begins the round it waits for once a gradient of it is handed over
            return max(self.board.ready_round, default=0) >= self._begins
        return not state.follower.lacking(state.ready)

    def held_up_by(self, indices: Sequence[int]) -> list[int]:
        """If the message this thread waits to launch lacks gradients of its round, and must go
        before one that carries the latest gradient of one of ``indices``: every gradient that
        round lacks (indices); else []."""
        state = self._waiting
        if not isinstance(state, RoundState):
            return []
        board, r = self.board, state.index
        if not state.follower.lacking(state.ready):
            return []
        k = state.follower.launched
        for i in indices:
            if board.ready_round[i] > r or (board.ready_round[i] == r and state.follower.carries_from(i, k)):
                return [j for j in range(len(board.ready_round)) if board.ready_round[j] < r]
        return []

    # -- called by the training thread ---------------------------------------------------------
    def between_rounds(self, run: Callable[[], T], timeout_s: float) -> T:
        """Run ``run`` on this thread once every message of the rounds begun so far has been
        launched, before the next round's first: the same point of the data group's order on
        every rank, if every rank asks at the same point of its training."""
        return self.outcome(self.queue(run), timeout_s)

    def queue(self, run: Callable[[], Any]) -> Job:
        """:meth:`between_rounds` without waiting: the job, for :meth:`outcome`."""
        with self.board.cond:
            if self.board.stopping:
                raise GradschedError("gradient communication has stopped")
            job = self._jobs.add(run, max(self.board.ready_round, default=0), self.board.device)
            self._wake.notify_all()
        return job

    def outcome(self, job: Job, timeout_s: float) -> Any:
        """Wait for a queued job; its result (raises what it raised)."""
        return job.outcome(timeout_s, lambda: self.board.error or (None if self._thread.is_alive() else "it stopped"))

    def stop(self, wait: bool) -> None:
        """End the thread; with ``wait``, wait for what is in flight; close the transport."""
        self._thread.join(timeout=5.0)
        with self.board.cond:
            pending = [f for state in self.rounds.values() for fs in state.futures.values() for f in fs]
            self.rounds.clear()
        for future in pending:
            if self.board.error is not None or not wait:
                break  # a failed collective: the backend's timeout ends the rest
            try:
                future.wait()
            except Exception:  # noqa: BLE001 - reported through board.error
                pass
        self.completion.stop(5.0 if wait else 0.5)
        self.transport.close(wait and self.board.error is None)
        self.transport = None

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        round_index = 1
        try:
            with self.board.device.own_stream("launcher") as self.stream:  # collectives and copies: this stream
                while True:
                    state = self._begin(round_index)
                    if state is None:
                        return
                    while state.follower.next is not None:
                        launch = self._await(state)
                        if launch is None:
                            return
                        self._launch(state, *launch)
                        launch = None  # its gradients: not kept alive while waiting for the next
                    state = launch = None  # nothing of a round launched stays alive here (its buffers)
                    round_index += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the training thread
            self.board.fail(exc)
        finally:
            with self.board.cond:
                self._jobs.fail_all()

    def _begin(self, round_index: int) -> RoundState | None:
        """Wait until the round has begun here (running jobs meanwhile), then set it up (None: stop)."""
        board = self.board
        with board.cond:
            self._begins = round_index
            # Choose the round's plan only once the round has begun here: a plan agreed at
            # the control point of the previous round must be in place. A job runs before the
            # first message of the round that had not begun here when it was queued (the
            # training thread queues jobs and hands gradients over): the same point on every
            # rank, however far behind this thread is.
            while self._jobs.waiting(round_index) or not any(r >= round_index for r in board.ready_round):
                if board.stopping:
                    return None
                job = self._jobs.due(round_index)
                if job is not None:
                    board.cond.release()
                    try:
                        job.execute()
                    finally:
                        board.cond.acquire()
                        job.done.set()
                    continue
                self._waiting = _ANY_ROUND
                board.cond.notify_all()  # progresses_alone() changed
                self._wake.wait()
            self._waiting = None
            adopted = self.versions.for_round(round_index)
            self.versions.forget_before(round_index)
            previous = self.rounds.get(round_index - 1)
            follower = (previous.follower.again() if previous is not None and previous.adopted is adopted
                        else RoundFollower(adopted.plan, board.index))
            state = RoundState(round_index, adopted, self.layouts.of(adopted), follower,
                               partial(_handed_over, board.ready_round, round_index))
            self.rounds[round_index] = state
            self.rounds.pop(round_index - 2, None)
            return state

    def _launchable(self, state: RoundState) -> bool:
        return state.follower.launchable(state.ready)

    def _await(self, state: RoundState) -> tuple | None:
        """Wait until the next message may start; take its buffers (None: stop)."""
        board = self.board
        with board.cond:
            while not self._launchable(state):
                if board.stopping:
                    return None
                self._waiting = state
                if state.follower.lacking(state.ready):  # progresses_alone() is False now; held_up_by() may say
                    board.wake_all()  # more (waiting for a credit instead, it progresses alone as when busy)
                self._wake.wait()
            self._waiting = None
            k, idle = state.follower.launch()
            message = state.plan.messages[k]
            carried = state.follower.carried(k)
            grads = [board.grads[i] for i in carried]
            produced = latest_per_stream(board.produced[i] for i in dict.fromkeys(carried))
            return k, message, grads, idle, produced

    def _launch(self, state: RoundState, k: int, message: PlannedMessage, grads: list[torch.Tensor],
                idle: bool, produced: list[Any]) -> None:
        self.board.device.wait_for(produced)  # what follows runs after the streams that wrote the gradients
        buffers, results, targets, divided = state.layout.pack(k, message, grads, self.divisor)
        if state.layout.reads_gradients_once and not self.board.device.ordered:
            with self.board.cond:  # packed (on the host: copied by now): what only the pack read can go
                state.packed[k] = sum(buffer.nbytes for buffer in buffers)
                self.board.packed_bytes += state.packed[k]
                self._let_go(state, k, packed=True)
                self.board.cond.notify_all()  # a backward pass may wait for the bytes (Exchange.mark_ready)
        launched_at = time.perf_counter()
        if not divided:
            self.transport.divide(buffers)
        futures = self.transport.send(MessageKey(state.index, state.adopted.version, k), buffers,
                                      on_sent=partial(self._sent, state, k))
        if targets is not None:
            futures = [f.then(partial(_copy_back, r, v)) for f, r, v in zip(futures, results, targets)]
            state.hold(k, results)
            self.copied_messages += 1
            self.copied_bytes += sum(buffer.nbytes for buffer in buffers)
        with self.board.cond:
            state.futures[k] = futures
            if self.on_event:
                self.on_event("launch", round=state.index, message=k, nbytes=message.nbytes, at=launched_at,
                              names=message.tensors)
        self.completion.track(futures, partial(self._resolved, state, k),
                              partial(self._finished, state, k, message, launched_at, idle))

    def _let_go(self, state: RoundState, k: int, packed: bool = False) -> None:
        """The gradients handed over whose every message of the round has finished (``packed``:
        has been packed, where a layout reads the gradients only to pack them): the board lets
        go of them (under sharding the last reference to a rank's whole local gradient, which
        the reduce-scatters read: ZeRO-2's release). Under the board's lock."""
        board, follower = self.board, state.follower
        over = (lambda m: m < follower.launched) if packed else (lambda m: follower.done[m])
        for i in dict.fromkeys(follower.carried(k)):
            if board.ready_round[i] == state.index and all(map(over, follower.messages_of[i])):
                board.hold(i, None)
                board.produced[i] = None

    def _resolved(self, state: RoundState, k: int, event: Any) -> None:
        """Message ``k``'s results are in place behind ``event`` (None on CPU)."""
        board = self.board
        with board.cond:
            reduced = state.follower.resolve(k)
            for i in reduced:
                board.result[i] = event
                board.reduced_round[i] = state.index
            board.reduced_now(reduced)  # (nothing else waits for a resolution)

    def _sent(self, state: RoundState, k: int) -> None:
        with self.board.cond:
            state.follower.mark_sent(k)
            self._wake.notify_all()

    def _finished(self, state: RoundState, k: int, message: PlannedMessage, launched_at: float, idle: bool,
                  now: float, error: BaseException | None) -> None:
        board = self.board
        if error is not None:
            if board.error is None and not board.closed:  # said at once: the training thread may be elsewhere
                logger.error("gradsched: gradient communication failed in round %d (message %d): %s",
                             state.index, k, error)
            board.fail(error)
            with board.cond:
                self._wake.notify_all()
            return
        transport = self.transport  # None once stopped
        if transport is not None:
            transport.finished(MessageKey(state.index, state.adopted.version, k))  # its memory may be reused
        with board.cond:
            self._timer.finished(message.nbytes, launched_at, idle, now)
            reduced = state.follower.finish(k)  # none: resolved before
            for i in reduced:
                board.result[i] = None
                board.reduced_round[i] = state.index
            board.reduced_now(reduced)
            self._let_go(state, k)
            board.packed_bytes -= state.packed.pop(k, 0)
            state.futures.pop(k, None)
            state.held.pop(k, None)
            if self.on_event:
                self.on_event("done", round=state.index, message=k, nbytes=message.nbytes, at=now)
            board.cond.notify_all()
            self._wake.notify_all()
