"""The exchange: gradients handed over by the training thread, and reduced by the launcher.

The training thread hands over each gradient as backward produces it (``mark_ready``) and
waits for reduced ones (``wait_reduced``); the launcher thread
(:mod:`gradsched.runtime.comm.launcher`) sends them as the plan of each round says
(:mod:`gradsched.runtime.comm.plans`), in the buffers the plan's layout gives them
(:mod:`gradsched.runtime.comm.layout`), through a transport
(:mod:`gradsched.runtime.comm.transport`), and learns of their end from the completion
(:mod:`gradsched.runtime.comm.completion`). What both sides see lives on the board
(:mod:`gradsched.runtime.comm.board`), each field with one writer; nothing polls.

The exchange owns all of these, and is the training thread's only way to them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence, TypeVar

import torch

from gradsched.core.estimator import LinkEstimator
from gradsched.core.plan import Plan
from gradsched.core.task import TensorSpec
from gradsched.runtime.config import Environment
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.torch_private import backward_running
from gradsched.runtime.comm.board import Board
from gradsched.runtime.comm.completion import completion_for
from gradsched.runtime.comm.launcher import Launcher
from gradsched.runtime.comm.layout import Layouts
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.transport import Transport
from gradsched.runtime.device import Device, Produced

T = TypeVar("T")


def _in_backward() -> bool:
    """Whether this thread runs a backward pass (one may still hand gradients over: activation
    checkpointing re-runs forward passes, and their hooks wait, inside backward)."""
    return backward_running()


class Exchange:
    def __init__(
        self,
        tensors: Sequence[TensorSpec],
        like: Sequence[torch.Tensor],
        versions: PlanVersions,
        transport: Transport,
        device: Device,
        timeout_s: float,
        on_event: Callable[..., None] | None = None,
        layout: Callable[[Plan], Any] | None = None,
        chunk_bytes: int | None = None,
        hold_bytes: int | None = None,
        homes_plan: Plan | None = None,
        estimator: LinkEstimator | None = None,
    ) -> None:
        self.board = board = Board(tensors, like, device)
        self.tensors = board.tensors
        self.versions = versions  # read and changed under the board's lock
        self.timeout_s = timeout_s
        self.estimator = estimator if estimator is not None else LinkEstimator()  # fitted from every completed message (kept by the run)
        self.explain: Callable[[], str] | None = None  # what the other ranks' progress says, for errors
        self.waited_s = 0.0  # seconds the waiters of wait_reduced blocked, in all (gradsched.runtime.diagnostics.exposure)
        #: the most bytes this rank holds for gradients not yet reduced before a backward pass waits for
        #: the link (None: no bound; under sharding, where a layout reads each gradient once)
        self.hold_bytes = hold_bytes
        self._layouts = Layouts(board.index, board.like, versions, layout, chunk_bytes, homes_plan)
        completion = completion_for(device, Environment.read().ordered_completion, timeout_s)
        self.launcher = Launcher(board, versions, self._layouts, transport, completion, self.estimator, on_event)
        self.launcher.start()

    @property
    def device(self) -> Device:
        """Where the gradients live, and how work on them is ordered (the board's)."""
        return self.board.device

    # -- plans and layouts ------------------------------------------------------------------
    @property
    def plans_adopted(self) -> int:
        return self.versions.count

    @property
    def ready_round(self) -> list[int]:
        return self.board.ready_round

    @property
    def error(self) -> BaseException | None:
        return self.board.error

    def set_plan(self, plan: Plan, first_round: int) -> None:
        """Use ``plan`` from round ``first_round`` on (agreed by all ranks beforehand)."""
        with self.board.cond:
            self.versions.adopt(plan, first_round)

    def plan_for(self, round_index: int) -> Plan:
        with self.board.cond:
            return self.versions.plan_for(round_index)

    def homes(self, round_index: int) -> dict[int, torch.Tensor]:
        """Where gradients must be handed over in round ``round_index`` (those fused in place)."""
        with self.board.cond:
            return self._layouts.of(self.versions.for_round(round_index)).homes

    # -- the training thread ------------------------------------------------------------------
    def mark_ready(self, i: int, grad: torch.Tensor, round_index: int, produced: Produced | None = None) -> None:
        """Hand over gradient ``i`` of round ``round_index`` (in its home, if it has one).
        ``produced`` (else where the current stream is now) marks where it was produced: the
        launcher's stream waits for it before anything reads the gradient."""
        if produced is None:
            produced = self.device.produced()
        board = self.board
        with board.cond:
            if board.in_flight(i):
                raise GradschedError(
                    f"gradient of {self.tensors[i].name!r} is ready again while its previous "
                    "reduction is still in flight"
                )
            board.hold(i, grad)
            board.produced[i] = produced
            board.ready_round[i] = round_index
            self.launcher.gradient_ready(round_index)
        if self.hold_bytes is not None:
            self._within_budget()

    def _within_budget(self) -> None:
        """Block the backward pass while this rank holds more than ``hold_bytes`` for gradients not
        yet reduced (handed over, or packed into messages in flight) and the launcher will pack or
        end a message without another gradient handed over (it never waits for one that this wait
        holds back): the link, not autograd, then sets the pace, and a rank holds at most the
        budget and the gradients of the message the launcher waits to launch."""
        board = self.board
        started = time.perf_counter()
        with board.cond:
            deadline = time.monotonic() + self.timeout_s
            while board.outstanding_bytes > self.hold_bytes and not board.stopping and (
                    board.packed_bytes > 0 or self.launcher.progresses_alone()):  # one ends, or one is packed
                left = deadline - time.monotonic()
                if left <= 0:
                    break  # a stuck peer: the reduction's own wait reports it, with the other ranks' progress
                board.cond.wait(min(left, 1.0))
        self.waited_s += time.perf_counter() - started

    def order_after(self, indices: Sequence[int]) -> int:
        """The current stream waits (on a device with streams: not the host) for the reduced
        values of the gradients ``indices`` that are not in flight; the waits queued."""
        board = self.board
        with board.cond:
            events = [board.result[i] for i in indices if not board.in_flight(i)]
        return self.device.wait_for(events)

    def in_flight(self, i: int) -> bool:
        return self.board.in_flight(i)

    def ended(self, i: int) -> bool:
        """Gradient ``i`` is reduced and its result is in place as far as the host knows: on the
        host once resolved; on a device with streams once the device has passed its event (on
        NCCL a message is resolved when queued). Settling an ended gradient waits for nothing."""
        board = self.board
        with board.cond:
            if board.in_flight(i):
                return False
            event = board.result[i]
        return event is None or self.device.passed(event)

    def wait_reduced(self, indices: Sequence[int], what: str = "parameters") -> None:
        """Block until every gradient in ``indices`` handed over so far is reduced (its result in
        place: on CUDA, ordered behind an event that :meth:`order_after` makes a stream wait for)."""
        started = time.perf_counter()
        failure = self._wait_reduced(indices, what)
        self.waited_s += time.perf_counter() - started
        if failure is not None:  # explained outside the lock: asking the other ranks takes seconds
            message, cause = failure
            raise GradschedError(message + (self.explain() if self.explain else "")) from cause

    def _wait_reduced(self, indices: Sequence[int], what: str) -> tuple[str, BaseException | None] | None:
        board = self.board
        with board.cond:
            deadline = time.monotonic() + self.timeout_s
            while True:
                if board.error is not None:
                    return f"gradient communication failed: {board.error}", board.error
                pending = [i for i in indices if board.in_flight(i)]
                if not pending:
                    return None
                absent = [] if _in_backward() else self.launcher.held_up_by(pending)
                if absent:  # only the training thread hands gradients over, and it is waiting here
                    names = [self.tensors[i].name for i in absent]
                    return (f"the reduction of {what} can never complete: it travels after gradients that the "
                            f"latest backward pass did not produce ({len(names)} parameters got none, e.g. "
                            f"{names[:3]}), and no backward pass is running that could; if some parameters are "
                            "legitimately unused, pass find_unused_parameters=True"), None
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [self.tensors[i].name for i in pending]
                    return (f"timed out after {self.timeout_s:.0f} s waiting for the reduction of {what} "
                            f"{names[:3]}: another rank is stuck or did not run the same backward passes"), None
                wanted = set(pending)  # woken when one of these is reduced (Board.reduced_now)
                board.wanted.append(wanted)
                try:
                    board.reduced.wait(min(left, 1.0))
                finally:
                    board.wanted.remove(wanted)

    def between_rounds(self, run: Callable[[], T]) -> T:
        """Run ``run`` (an operation on the data group) on the launcher thread, at the same point
        of the data group's order on every rank: after every message handed over so far has
        been launched, before the next round's first (see :meth:`Launcher.between_rounds`)."""
        return self.launcher.between_rounds(run, self.timeout_s)

    def after_launched(self, run: Callable[[], T]) -> Callable[[], T]:
        """:meth:`between_rounds` without waiting: returns what waits for ``run``'s result."""
        job = self.launcher.queue(run)
        return lambda: self.launcher.outcome(job, self.timeout_s)

    # -- both threads -------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Communication failed: every waiter raises from now on."""
        self.board.fail(exc)
        with self.board.cond:
            self.launcher.wake()

    def close(self, wait: bool = True) -> None:
        """Stop the launcher thread and let go of every collective's future and buffer.

        With ``wait``, results still in flight are waited for (bounded by the timeout), so that no
        communication thread of the backend runs a callback of ours, or frees a tensor
        created here, after the interpreter has begun to exit (which aborts the process)."""
        board = self.board
        with board.cond:
            board.closed = True
            board.wake_all()
            self.launcher.wake()
        self.launcher.stop(wait and board.error is None)
        self.release_buffers()
        self.device.close()

    def release_buffers(self) -> None:
        """Let go of the flat buffers of every plan, of what the transport keeps between messages
        (compression's wire copies) and of the gradients handed over (the hand-off to DDP's
        reducer: its buckets hold the gradients from now on; close). Nothing may be in flight."""
        board = self.board
        transport = self.launcher.transport
        if transport is not None:
            transport.release()  # compression's wire copies
        with board.cond:
            self._layouts.clear()
            self.launcher.rounds.clear()  # the launcher waits for a round that will not begin
            board.let_go_of_all()
            board.produced = [None] * len(board.produced)
            board.result = [None] * len(board.result)
