"""Communication tasks: the unit every policy schedules.

A :class:`TensorSpec` describes one gradient tensor. The engine makes one root
:class:`CommTask` per tensor; a partitioner may split it into child tasks (slices of the
tensor, in element order, with contiguous places in the priority order). Leaves are what
become ready, start and finish; a parent follows its children.

>>> t = CommTask(0, TensorSpec("fc.weight", numel=10, layer=3, priority=5))
>>> [(c.offset, c.numel) for c in t.partition(max_bytes=16)]
[(0, 4), (4, 4), (8, 2)]
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class TensorSpec:
    """One gradient tensor as the scheduler sees it.

    ``priority`` orders tensors by urgency: smaller is more urgent. The convention is the
    tensor's position in forward order, so layers near the input come first.
    """

    name: str
    numel: int
    layer: int  # index of the owning layer in forward order
    priority: int
    element_size: int = 4  # bytes per element (fp32 gradients by default)

    def __post_init__(self) -> None:
        if self.numel < 1:
            raise ValueError(f"tensor {self.name!r}: numel must be >= 1, got {self.numel}")
        if self.element_size < 1:
            raise ValueError(f"tensor {self.name!r}: element_size must be >= 1, got {self.element_size}")

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


class TaskState(enum.IntEnum):
    PENDING = 0  # waiting for its gradient
    READY = 1  # gradient computed, waiting for the policy
    STARTED = 2  # handed to the network
    FINISHED = 3  # reduced result available


class IllegalTransition(RuntimeError):
    """A task was moved out of order (e.g. started twice): a scheduler bug, never user error."""


class CommTask:
    """A tensor or a contiguous slice of one, with a lifecycle ready -> started -> finished."""

    __slots__ = ("id", "tensor", "offset", "numel", "index", "parent", "children", "state", "_open")

    def __init__(
        self,
        task_id: int,
        tensor: TensorSpec,
        offset: int = 0,
        numel: int | None = None,
        index: int = 0,
        parent: CommTask | None = None,
    ) -> None:
        self.id = task_id
        self.tensor = tensor
        self.offset = offset  # first element of the slice
        self.numel = tensor.numel if numel is None else numel
        self.index = index  # position among the parent's children
        self.parent = parent
        self.children: list[CommTask] = []
        self.state = TaskState.PENDING
        self._open = 0  # children not yet finished

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        if self.parent is None:
            return self.tensor.name
        return f"{self.tensor.name}[{self.index}]"

    @property
    def priority(self) -> int:
        return self.tensor.priority

    @property
    def nbytes(self) -> int:
        return self.numel * self.tensor.element_size

    def __repr__(self) -> str:
        return f"CommTask({self.name}, {self.nbytes}B, {self.state.name})"

    # -- structure ----------------------------------------------------------------------
    def partition(self, max_bytes: int, next_id: int | None = None) -> list[CommTask]:
        """Split into children of at most ``max_bytes`` each (element aligned, last one
        smaller). A task that already fits stays whole and is returned alone.

        Children get ids ``next_id, next_id + 1, ...`` (default: right after this id).
        """
        if self.children:
            raise IllegalTransition(f"{self.name} is already partitioned")
        per = max(1, max_bytes // self.tensor.element_size)
        if self.numel <= per:
            return [self]
        first = self.id + 1 if next_id is None else next_id
        for i, start in enumerate(range(0, self.numel, per)):
            child = CommTask(
                first + i,
                self.tensor,
                offset=self.offset + start,
                numel=min(per, self.numel - start),
                index=i,
                parent=self,
            )
            self.children.append(child)
        self._open = len(self.children)
        return list(self.children)

    def leaves(self) -> Iterator[CommTask]:
        if not self.children:
            yield self
        else:
            for child in self.children:
                yield from child.leaves()

    # -- lifecycle ----------------------------------------------------------------------
    def reset(self) -> None:
        """Back to PENDING for a new iteration."""
        self.state = TaskState.PENDING
        self._open = len(self.children)
        for child in self.children:
            child.reset()

    def notify_ready(self) -> None:
        self._move(TaskState.PENDING, TaskState.READY)
        for child in self.children:
            child.notify_ready()

    def start(self) -> None:
        if self.children:
            raise IllegalTransition(f"{self.name} is partitioned: start its leaves")
        self._move(TaskState.READY, TaskState.STARTED)
        parent = self.parent
        while parent is not None and parent.state == TaskState.READY:
            parent.state = TaskState.STARTED
            parent = parent.parent

    def notify_finish(self) -> CommTask | None:
        """Finish a leaf. Returns the root task if this completed it, else None."""
        if self.children:
            raise IllegalTransition(f"{self.name} is partitioned: finish its leaves")
        self._move(TaskState.STARTED, TaskState.FINISHED)
        node = self
        while node.parent is not None:
            node = node.parent
            node._open -= 1
            if node._open:
                return None
            node.state = TaskState.FINISHED
        return node

    def _move(self, expected: TaskState, new: TaskState) -> None:
        if self.state != expected:
            raise IllegalTransition(
                f"{self.name}: cannot go to {new.name} from {self.state.name} (expected {expected.name})"
            )
        self.state = new


@dataclass(eq=False)
class Message:
    """Leaf tasks launched together as one network operation (fused when more than one).

    The runtime issues one collective (or one push/pull) per message; the simulator charges
    one per-message latency. ``id`` is unique and increasing within one engine.
    """

    id: int
    tasks: tuple[CommTask, ...]
    iteration: int
    launched_at: float
    isolated: bool  # nothing else was in flight when it was launched
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(t.nbytes for t in self.tasks)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def __repr__(self) -> str:
        return f"Message({self.id}, {self.names}, {self.nbytes}B)"
