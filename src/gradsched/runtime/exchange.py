"""The exchange: moves gradients between ranks by following a :class:`~gradsched.sim.plan.Plan`.

One launcher thread per rank walks the plan of each round in order and starts message k
(an async all-reduce on the data group, or a push to a parameter server and a pull back:
see :mod:`gradsched.runtime.transport`) as soon as every earlier message has started, its
gradients are ready on this rank, and the event that released it in the plan has happened
here too. Completion callbacks copy fused results back and mark gradients reduced. The
main thread only reports ready gradients and waits for reduced ones.

Every rank issues the same collectives in the same order, because the order comes from the
plan, never from local timing. All shared state is guarded by one condition variable; the
launcher sleeps on it and nothing polls.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..core.estimator import CompletionTimer, LinkEstimator
from ..core.task import TensorSpec
from ..sim.plan import Plan, PlannedMessage
from .errors import GradschedError
from .transport import AllReduce, Transport


@dataclass
class _Round:
    """Launch and completion progress of one round (one backward pass) on this rank."""

    index: int
    plan: Plan
    layout: _Layout
    launched: int = 0
    done: list[bool] = field(default_factory=list)
    remaining: dict[int, int] = field(default_factory=dict)  # tensor -> slices not yet reduced
    messages_of: dict[int, list[int]] = field(default_factory=dict)  # tensor -> messages carrying it
    futures: dict[int, torch.futures.Future] = field(default_factory=dict)  # message -> result ready
    in_flight: int = 0


class _Layout:
    """Where the gradients live under one plan: one flat buffer per dtype and device, each
    gradient a contiguous view of it ("home"), gradients in the order the plan first sends
    them. A message whose slices are consecutive in that order is a view of the buffer too
    and is reduced in place: no copy in at launch, no copy back. Others (a block that skipped
    ahead to fill its budget, mixed dtypes) are copied into a temporary buffer and back."""

    def __init__(self, plan: Plan, index: dict[str, int], like: Sequence[torch.Tensor]) -> None:
        self.plan = plan
        order: list[int] = []
        for message in plan.messages:
            for name, _, _ in message.slices:
                if index[name] not in order:
                    order.append(index[name])
        sizes: dict[tuple, int] = {}
        place: dict[int, tuple[tuple, int]] = {}  # tensor -> (buffer key, first element)
        for i in order:
            key = (like[i].dtype, like[i].device)
            place[i] = (key, sizes.get(key, 0))
            sizes[key] = sizes.get(key, 0) + like[i].numel()
        flat = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in sizes.items()}
        self.homes: dict[int, torch.Tensor] = {
            i: flat[key][start : start + like[i].numel()].view_as(like[i]) for i, (key, start) in place.items()
        }
        self.buffers: dict[int, torch.Tensor] = {}  # message -> its range of a flat buffer
        for k, message in enumerate(plan.messages):
            ranges = []
            for name, offset, numel in message.slices:
                key, start = place[index[name]]
                ranges.append((key, start + offset, numel))
            key = ranges[0][0]
            if all(r[0] == key for r in ranges) and all(
                a[1] + a[2] == b[1] for a, b in zip(ranges, ranges[1:])
            ):
                first = ranges[0][1]
                self.buffers[k] = flat[key][first : ranges[-1][1] + ranges[-1][2]]


class Exchange:
    def __init__(
        self,
        tensors: Sequence[TensorSpec],
        like: Sequence[torch.Tensor],
        plan: Plan,
        group: dist.ProcessGroup,
        world_size: int,
        timeout_s: float,
        on_event: Callable[..., None] | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.tensors = list(tensors)
        self.index = {t.name: i for i, t in enumerate(self.tensors)}
        self.like = list(like)  # the parameters: shape, dtype and device of each gradient
        self._layouts: dict[int, _Layout] = {}
        self.group = group
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.on_event = on_event  # tracing: on_event(kind, **fields), called under the lock
        self.cond = threading.Condition()  # main-thread waiters (reduced gradients)
        self._launcher = threading.Condition(self.cond)  # the launcher, on the same lock
        self._waiting: tuple | None = None  # what the launcher waits for, to wake it only then
        n = len(self.tensors)
        self.ready_round = [0] * n  # last round in which the gradient was handed over
        self.reduced_round = [0] * n  # last round whose reduction of the tensor completed
        self.grads: list[torch.Tensor | None] = [None] * n
        self.estimator = LinkEstimator()
        self._timer = CompletionTimer(self.estimator)
        self._plans: list[tuple[int, Plan, int]] = [(1, plan, 1)]  # (first round, plan, number in adoption order)
        self.plans_adopted = 1
        self.transport = transport or AllReduce(group)
        self.transport.announce(plan, 1)
        self._rounds: dict[int, _Round] = {}
        self.error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gradsched-launcher", daemon=True)
        self._thread.start()

    # -- main thread ----------------------------------------------------------------------
    def homes(self, round_index: int) -> dict[int, torch.Tensor]:
        """Where gradients must be handed over in round ``round_index`` (those fused in place)."""
        return self._layout(self.plan_for(round_index)).homes

    def _layout(self, plan: Plan) -> _Layout:
        layout = self._layouts.get(id(plan))
        if layout is None or layout.plan is not plan:
            self._layouts = {k: v for k, v in self._layouts.items() if any(v.plan is p for _, p, _ in self._plans)}
            layout = self._layouts[id(plan)] = _Layout(plan, self.index, self.like)
        return layout

    def mark_ready(self, i: int, grad: torch.Tensor, round_index: int) -> None:
        """Hand over gradient ``i`` of round ``round_index`` (in its home, if it has one)."""
        with self.cond:
            if self.reduced_round[i] < self.ready_round[i]:
                raise GradschedError(
                    f"gradient of {self.tensors[i].name!r} is ready again while its previous "
                    "reduction is still in flight"
                )
            self.grads[i] = grad
            self.ready_round[i] = round_index
            waiting = self._waiting
            if waiting is not None and (
                waiting[0] == "round" or (waiting[1].index == round_index and self._launchable(*waiting[1:]))
            ):
                self._launcher.notify()

    def set_plan(self, plan: Plan, first_round: int) -> None:
        """Use ``plan`` from round ``first_round`` on (agreed by all ranks beforehand)."""
        with self.cond:
            self.plans_adopted += 1
            self._plans.append((first_round, plan, self.plans_adopted))
            self.transport.announce(plan, self.plans_adopted)

    def plan_for(self, round_index: int) -> Plan:
        return self._entry_for(round_index)[1]

    def _entry_for(self, round_index: int) -> tuple[int, Plan, int]:
        return max((e for e in self._plans if e[0] <= round_index), key=lambda e: e[0])

    def in_flight(self, i: int) -> bool:
        return self.reduced_round[i] < self.ready_round[i]

    def wait_reduced(self, indices: Sequence[int], what: str = "parameters") -> None:
        """Block until every gradient in ``indices`` handed over so far is reduced."""
        with self.cond:
            if all(self.reduced_round[i] >= self.ready_round[i] for i in indices):
                self._raise_if_failed()
                return
            deadline = time.monotonic() + self.timeout_s
            while True:
                self._raise_if_failed()
                if all(self.reduced_round[i] >= self.ready_round[i] for i in indices):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    pending = [self.tensors[i].name for i in indices if self.reduced_round[i] < self.ready_round[i]]
                    raise GradschedError(
                        f"timed out after {self.timeout_s:.0f} s waiting for the reduction of {what} "
                        f"{pending[:3]}: another rank is stuck or did not run the same backward passes"
                    )
                self.cond.wait(min(left, 1.0))

    def order_after_reduction(self, indices: Sequence[int]) -> None:
        """Make the current stream wait for the reductions of these (reduced) gradients. A
        no-op on CPU; on CUDA, NCCL results are ordered by stream, not by the CPU seeing them."""
        waited = set()
        for i in indices:
            state = self._rounds.get(self.ready_round[i])
            for k in state.messages_of.get(i, ()) if state else ():
                if (state.index, k) not in waited and k in state.futures:
                    waited.add((state.index, k))
                    state.futures[k].wait()

    def close(self, wait: bool = True) -> None:
        """Stop the launcher thread and let go of every collective's future and buffer.

        With ``wait``, results still in flight are waited for (bounded by the timeout), so that no
        communication thread of the backend runs a callback of ours, or frees a tensor
        created here, after the interpreter has begun to exit (which aborts the process)."""
        with self.cond:
            self._closed = True
            self.cond.notify_all()
            self._launcher.notify_all()
        self._thread.join(timeout=5.0)
        with self.cond:
            pending = [f for state in self._rounds.values() for f in state.futures.values()]
            self._rounds.clear()
            self._layouts.clear()
            self.grads = [None] * len(self.grads)
        for future in pending:
            if self.error is not None or not wait:
                break  # a failed collective: the backend's timeout ends the rest
            try:
                future.wait()
            except Exception:  # noqa: BLE001 - reported through self.error
                pass
        self.transport.close(wait and self.error is None)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise GradschedError(f"gradient communication failed: {self.error}") from self.error

    # -- launcher thread ------------------------------------------------------------------
    def _run(self) -> None:
        round_index = 1
        try:
            cuda = next((t.device for t in self.like if t.is_cuda), None)
            if cuda is not None:  # collectives and copies of this thread go to that device
                torch.cuda.set_device(cuda)
            while True:
                with self.cond:
                    # Choose the round's plan only once the round has begun here: a plan
                    # agreed at the control point of the previous round must be in place.
                    while not any(r >= round_index for r in self.ready_round):
                        if self._closed or self.error is not None:
                            return
                        self._waiting = ("round",)
                        self._launcher.wait()
                    self._waiting = None
                    state = self._start_round(round_index)
                for k, message in enumerate(state.plan.messages):
                    with self.cond:
                        while not self._launchable(state, k, message):
                            if self._closed or self.error is not None:
                                return
                            self._waiting = ("message", state, k, message)
                            self._launcher.wait()
                        self._waiting = None
                        state.launched = k + 1
                        state.in_flight += 1
                        idle = state.in_flight == 1
                        views = [self._view(name, offset, numel) for name, offset, numel in message.slices]
                        fused = state.layout.buffers.get(k)
                    self._launch(state, k, message, views, idle, fused)
                round_index += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _start_round(self, round_index: int) -> _Round:
        entry = self._entry_for(round_index)
        plan = entry[1]
        self.transport.begin_round(round_index, entry[2])
        # plans that took effect before this round's are no longer needed
        self._plans = [e for e in self._plans if e[0] > round_index or e is entry]
        state = _Round(round_index, plan, self._layout(plan), done=[False] * len(plan.messages))
        for k, message in enumerate(plan.messages):
            for name, _, _ in message.slices:
                i = self.index[name]
                state.remaining[i] = state.remaining.get(i, 0) + 1
                state.messages_of.setdefault(i, []).append(k)
        self._rounds[round_index] = state
        self._rounds.pop(round_index - 2, None)
        return state

    def _launchable(self, state: _Round, k: int, message: PlannedMessage) -> bool:
        r = state.index
        for name, _, _ in message.slices:
            if self.ready_round[self.index[name]] < r:
                return False
        if message.after_tensor is not None and self.ready_round[self.index[message.after_tensor]] < r:
            return False
        return message.after_message is None or state.done[message.after_message]

    def _view(self, name: str, offset: int, numel: int) -> torch.Tensor:
        grad = self.grads[self.index[name]]
        return grad.view(-1)[offset : offset + numel]

    def _launch(self, state: _Round, k: int, message: PlannedMessage, views: list[torch.Tensor], idle: bool,
                fused: torch.Tensor | None) -> None:
        if fused is not None:  # the gradients already live, in order, in the message's range
            buffers = [fused]
            groups = None
        elif len(views) == 1:
            buffers = [views[0]]
            groups = None
        else:  # copy into one buffer per dtype: one collective per dtype, in a fixed order
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for view in views:
                by_dtype.setdefault(view.dtype, []).append(view)
            groups = [by_dtype[d] for d in sorted(by_dtype, key=str)]
            buffers = [torch.cat(g) for g in groups]
        launched_at = time.perf_counter()
        for buffer in buffers:
            buffer.div_(self.world_size)
        started, results = self.transport.start(k, state.plan, buffers)
        if self.on_event:
            self.on_event("launch", round=state.index, message=k, nbytes=message.nbytes, at=launched_at,
                          names=[name for name, _, _ in message.slices])
        futures = torch.futures.collect_all(started)
        # then(): the returned future also covers the copy back, in CUDA stream order
        state.futures[k] = futures.then(
            lambda fut: self._finished(fut, state, k, message, buffers, results, groups, launched_at, idle)
        )

    def _finished(self, fut, state, k, message, buffers, results, groups, launched_at, idle) -> None:
        now = time.perf_counter()
        try:
            for inner in fut.value():
                inner.value()  # raises if the collective failed
            for buffer, result in zip(buffers, results):
                if result is not buffer:  # pulled from a server into a buffer of its own
                    buffer.copy_(result)
            if groups is not None:
                for buffer, views in zip(buffers, groups):  # the views alias the gradients
                    offset = 0
                    for view in views:
                        view.copy_(buffer[offset : offset + view.numel()])
                        offset += view.numel()
        except BaseException as exc:  # noqa: BLE001
            with self.cond:
                self.error = exc
                self.cond.notify_all()
                self._launcher.notify_all()
            return
        with self.cond:
            state.done[k] = True
            state.in_flight -= 1
            self._timer.finished(message.nbytes, launched_at, idle, now)
            for name, _, _ in message.slices:
                i = self.index[name]
                state.remaining[i] -= 1
                if state.remaining[i] == 0:
                    self.reduced_round[i] = state.index
            if self.on_event:
                self.on_event("done", round=state.index, message=k, nbytes=message.nbytes, at=now)
            self.cond.notify_all()
            self._launcher.notify_all()
