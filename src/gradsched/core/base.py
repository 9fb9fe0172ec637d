"""The three policy axes and the :class:`Policy` that bundles one strategy of each.

A policy is *partitioning* (how a tensor's task is cut into leaves) + *ordering* (which
ready leaf is most urgent) + *flow control* (when queued leaves start and which of them
travel together as one message) + whether the next forward pass may cross the iteration
barrier (wait only for its own layer's update).

Strategies hold no clock and no threads. The engine calls them in response to the events
it is fed, always passing the current time ``now`` as data, and the same calls happen in
the simulator and in the runtime.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol

from .task import CommTask, Message, TensorSpec

from .estimator import LinkEstimator


class Scheduler(Protocol):
    """What the policy axes see of the engine (:class:`gradsched.core.engine.Scheduler`)."""

    tensors: dict[str, TensorSpec]
    leaves: dict[str, list[CommTask]]
    estimator: LinkEstimator
    iteration: int
    in_flight_bytes: int
    unsent_bytes: int
    hold_bytes: int | None

    def held_bytes(self) -> int: ...

    def oldest_waiting(self) -> list[CommTask]: ...

    def take(self, tasks: list[CommTask]) -> None: ...

    @property
    def in_flight_count(self) -> int: ...

    @property
    def unsent_count(self) -> int: ...

    @property
    def backward_done(self) -> bool: ...

    def peek(self) -> CommTask | None: ...

    def pop(self) -> CommTask: ...

    def requeue(self, tasks: list[CommTask]) -> None: ...


class Partitioner(ABC):
    """Partitioning axis. ``split`` is called once per tensor when an engine is built."""

    @abstractmethod
    def split(self, root: CommTask, next_id: int) -> list[CommTask]:
        """Return the leaves of ``root`` (``[root]`` to keep it whole). New tasks take ids
        from ``next_id`` upwards."""


class Ordering(ABC):
    """Ordering axis. ``key`` is called when a leaf becomes ready; the ready queue releases
    the smallest key first. The engine appends a sequence number, so ties go to the leaf
    that became ready first."""

    @abstractmethod
    def key(self, task: CommTask) -> tuple:
        ...


class FlowControl(ABC):
    """Flow-control axis: decides, after every event, which queued leaves start now and how
    they are grouped into messages. It takes leaves off the queue with ``engine.pop()``.

    Call order per iteration: ``begin_iteration`` once when a backward pass begins, then
    ``on_ready`` / ``on_finished`` as events arrive, each followed by ``select``.
    """

    #: iterations this strategy needs before it behaves as in steady state (profiling)
    warmup_iterations: int = 0
    #: True: it limits only messages still being sent (with parameter servers, a message
    #: whose push is done no longer counts while its pull comes back); the engine then
    #: asks it to select after every ``on_sent`` too. False: until the message finished.
    until_sent: bool = False
    #: the most messages it lets be limited at once (None: no count)
    max_messages: int | None = None

    def setup(self, engine: Scheduler) -> None:
        """Called once when the engine is built, after the leaves exist."""

    def begin_iteration(self, engine: Scheduler, now: float) -> None:
        """Called when a new backward pass begins (nothing is in flight then)."""

    def on_ready(self, engine: Scheduler, tensor: TensorSpec, now: float) -> None:
        """Called after all leaves of ``tensor`` joined the ready queue."""

    def on_finished(self, engine: Scheduler, message: Message, now: float) -> None:
        """Called after ``message`` finished and its bytes left the in-flight count."""

    def limited_bytes(self, engine: Scheduler) -> int:
        """The bytes its window limits: in flight, or (``until_sent``) still being sent."""
        return engine.unsent_bytes if self.until_sent else engine.in_flight_bytes

    def limited_count(self, engine: Scheduler) -> int:
        """The messages its window limits, counted as ``limited_bytes`` counts bytes."""
        return engine.unsent_count if self.until_sent else engine.in_flight_count

    @abstractmethod
    def select(self, engine: Scheduler, now: float) -> list[list[CommTask]]:
        """Leaves to start now, grouped into messages, in launch order."""

    def relieve(self, engine: Scheduler) -> list[list[CommTask]]:
        """The memory rule, asked before ``select`` where the engine has a ``hold_bytes``: while
        more than that many bytes of gradients wait (each held whole until its every leaf has
        started), the leaves of the one that became ready first start (a message per gradient),
        as far as the window admits, before anything more urgent and whatever the strategy would
        wait for (a fuller block, a later stage). Where the window admits none, the rank holds
        them until the link frees it (the runtime's backward pass then waits). A strategy that
        bounds what waits by its own rule overrides this."""
        slots = float("inf") if self.max_messages is None else self.max_messages - self.limited_count(engine)
        limited = self.limited_bytes(engine)
        groups: list[list[CommTask]] = []  # one message per gradient
        while engine.held_bytes() > engine.hold_bytes and len(groups) < slots:
            oldest = engine.oldest_waiting()
            admitted = []
            for leaf in oldest:
                if limited > 0 and limited + leaf.nbytes > self.window():
                    break
                admitted.append(leaf)
                limited += leaf.nbytes
            if admitted:
                engine.take(admitted)
                groups.append(admitted)
            if len(admitted) < len(oldest):
                break
        return groups

    @abstractmethod
    def window(self) -> float:
        """The most bytes this strategy lets be in flight right now (``inf`` for none).
        The engine checks every launch against it: a lone message larger than the window
        is allowed when nothing else is in flight, so a big leaf can never deadlock."""


@dataclass(frozen=True)
class Policy:
    """One strategy per axis, ready to drive one engine. Stateful: build one per engine."""

    name: str
    partitioner: Partitioner
    ordering: Ordering
    flow: FlowControl
    cross_barrier: bool  # next forward of a layer waits only for that layer's update

    @property
    def warmup_iterations(self) -> int:
        return self.flow.warmup_iterations


@dataclass(frozen=True)
class PolicyConfig:
    """Base of every policy's frozen, validated configuration.

    Subclasses set ``name`` and implement ``build``; fields ending in ``_bytes`` accept
    sizes like ``"4MiB"`` through :meth:`with_overrides`.
    """

    name: ClassVar[str] = ""
    #: the policy is DDP's own scheme (buckets in reverse order): nothing to measure it against,
    #: and what a policy that loses its trial falls back to
    is_buckets: ClassVar[bool] = False

    def build(self) -> Policy:  # pragma: no cover - abstract
        raise NotImplementedError

    def for_link(self, total_bytes: int, latency_s: float, seconds_per_byte: float, overhead_s: float) -> PolicyConfig:
        """This configuration with the options it derives from the link and the model filled in
        (``total_bytes`` of gradients; the link's latency, cost per payload byte and per-message
        overhead as the simulator models them). Policies without derived options return it as
        it is; the simulator and the plan maker call this before :meth:`build`."""
        return self

    @property
    def derived(self) -> bool:
        """Whether an option is still to be derived from the link (:meth:`for_link`)."""
        return False

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.name, **dataclasses.asdict(self)}

    def with_overrides(self, **values: Any) -> PolicyConfig:
        """A copy with some fields replaced; strings are parsed by the field's type."""
        from ..units import parse_bytes

        fields = {f.name: f for f in dataclasses.fields(self)}
        parsed = {}
        for key, value in values.items():
            if key not in fields:
                raise ValueError(
                    f"policy {self.name!r} has no option {key!r}; options: {', '.join(sorted(fields))}"
                )
            derived = fields[key].default is None  # None: the policy derives it (see for_link)
            parsed[key] = None if derived and _is_auto(value) else _parse_field(key, getattr(self, key), value,
                                                                                parse_bytes)
        return dataclasses.replace(self, **parsed)


def _is_auto(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == "auto")


def _parse_field(key: str, current: Any, value: Any, parse_bytes: Callable[[str], int]) -> Any:
    if not isinstance(value, str):
        return value
    if key.endswith("_bytes"):
        try:
            return parse_bytes(value)
        except ValueError as exc:
            raise ValueError(f"option {key}: {exc}") from None
    try:
        if isinstance(current, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(current, int):
            return int(value)
        if isinstance(current, float):
            return float(value)
    except ValueError:
        raise ValueError(f"option {key}: cannot read {value!r} as {type(current).__name__}") from None
    return value


def require(condition: bool, message: str) -> None:
    """Config validation helper: raise ValueError(message) unless condition holds."""
    if not condition:
        raise ValueError(message)
