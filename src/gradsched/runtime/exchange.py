"""The exchange: gradients handed over by the training thread, and reduced by the launcher.

The training thread hands over each gradient as backward produces it (``mark_ready``) and
waits for reduced ones (``wait_reduced``); the launcher thread
(:mod:`gradsched.runtime.launcher`) sends them as the plan of each round says
(:mod:`gradsched.runtime.plans`), in the buffers the plan's layout gives them
(:mod:`gradsched.runtime.layout`), through a transport (:mod:`gradsched.runtime.transport`).

All shared state is guarded by one condition variable; nothing polls.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import torch

from ..core.estimator import LinkEstimator
from ..core.plan import Plan
from ..core.task import TensorSpec
from .errors import GradschedError
from .launcher import Launcher
from .layout import BufferLayout
from .plans import Adopted, PlanVersions
from .transport import Transport


def _in_backward() -> bool:
    """Whether this thread runs a backward pass (one may still hand gradients over: activation
    checkpointing re-runs forward passes, and their hooks wait, inside backward)."""
    return torch._C._current_graph_task_id() != -1


class Exchange:
    def __init__(
        self,
        tensors: Sequence[TensorSpec],
        like: Sequence[torch.Tensor],
        versions: PlanVersions,
        transport: Transport,
        timeout_s: float,
        on_event: Callable[..., None] | None = None,
    ) -> None:
        self.tensors = list(tensors)
        self.index = {t.name: i for i, t in enumerate(self.tensors)}
        self.like = list(like)  # the parameters: shape, dtype and device of each gradient
        self.versions = versions
        self.timeout_s = timeout_s
        self.cond = threading.Condition()  # main-thread waiters (reduced gradients); the launcher shares its lock
        n = len(self.tensors)
        self.ready_round = [0] * n  # last round in which the gradient was handed over
        self.reduced_round = [0] * n  # last round whose reduction of the tensor completed
        self.grads: list[torch.Tensor | None] = [None] * n
        self.estimator = LinkEstimator()  # fitted from every completed message
        self.error: BaseException | None = None
        self.explain: Callable[[], str] | None = None  # what the other ranks' progress says, for errors
        self.closed = False
        self._layouts: dict[int, BufferLayout] = {}  # plan version -> layout
        self.launcher = Launcher(self, transport, on_event)
        self.launcher.start()

    # -- plans and layouts ------------------------------------------------------------------
    @property
    def plans_adopted(self) -> int:
        return self.versions.count

    def set_plan(self, plan: Plan, first_round: int) -> None:
        """Use ``plan`` from round ``first_round`` on (agreed by all ranks beforehand)."""
        with self.cond:
            self.versions.adopt(plan, first_round)

    def plan_for(self, round_index: int) -> Plan:
        with self.cond:
            return self.versions.plan_for(round_index)

    def layout(self, adopted: Adopted) -> BufferLayout:
        with self.cond:
            layout = self._layouts.get(adopted.version)
            if layout is None:
                self._layouts = {v: l for v, l in self._layouts.items() if v in self.versions}
                layout = self._layouts[adopted.version] = BufferLayout(adopted.plan, self.index, self.like)
            return layout

    def homes(self, round_index: int) -> dict[int, torch.Tensor]:
        """Where gradients must be handed over in round ``round_index`` (those fused in place)."""
        with self.cond:
            return self.layout(self.versions.for_round(round_index)).homes

    # -- the training thread ------------------------------------------------------------------
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
            self.launcher.gradient_ready(round_index)

    def in_flight(self, i: int) -> bool:
        return self.reduced_round[i] < self.ready_round[i]

    def wait_reduced(self, indices: Sequence[int], what: str = "parameters") -> None:
        """Block until every gradient in ``indices`` handed over so far is reduced."""
        failure = self._wait_reduced(indices, what)
        if failure is not None:  # explained outside the lock: asking the other ranks takes seconds
            message, cause = failure
            raise GradschedError(message + (self.explain() if self.explain else "")) from cause

    def _wait_reduced(self, indices: Sequence[int], what: str) -> tuple[str, BaseException | None] | None:
        with self.cond:
            deadline = time.monotonic() + self.timeout_s
            while True:
                if self.error is not None:
                    return f"gradient communication failed: {self.error}", self.error
                pending = [i for i in indices if self.reduced_round[i] < self.ready_round[i]]
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
                self.cond.wait(min(left, 1.0))

    def order_after_reduction(self, indices: Sequence[int]) -> None:
        """Make the current stream wait for the reductions of these (reduced) gradients. A
        no-op on CPU; on CUDA, NCCL results are ordered by stream, not by the CPU seeing them."""
        for future in self.launcher.reduction_futures(indices, self.ready_round):
            future.wait()

    # -- both threads -------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Communication failed: every waiter raises from now on."""
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()
            self.launcher.wake()

    def close(self, wait: bool = True) -> None:
        """Stop the launcher thread and let go of every collective's future and buffer.

        With ``wait``, results still in flight are waited for (bounded by the timeout), so that no
        communication thread of the backend runs a callback of ours, or frees a tensor
        created here, after the interpreter has begun to exit (which aborts the process)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            self.launcher.wake()
        self.launcher.stop(wait and self.error is None)
        with self.cond:
            self._layouts.clear()
            self.grads = [None] * len(self.grads)
