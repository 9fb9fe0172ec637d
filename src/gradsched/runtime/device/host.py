"""The host as a device: CPU tensors on gloo.

There is nothing to order: every tensor operation is done when it returns, and a gloo
collective's future completes once its result is in place (gloo's worker thread wrote it),
so a callback of the future, or anything after ``wait()``, sees the result.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from gradsched.runtime.device.base import HostTimed, Produced, future_of

T = TypeVar("T")


class HostDevice(HostTimed):
    name = "cpu"
    ordered = False
    point_to_point = True

    def record(self) -> None:
        return None

    def produced(self, event: Any = None, written: Any = None) -> Produced | None:
        return None

    def wait_for(self, events: Iterable[Any]) -> int:
        return 0

    def passed(self, event: Any) -> bool:
        return True

    def used_here(self, tensor: Any) -> None:
        pass

    @contextlib.contextmanager
    def own_stream(self, role: str) -> Iterator[None]:
        yield None

    def issue(self, group: Any, start: Callable[[], Any]) -> Any:
        return future_of(start())

    def issue_each(self, group: Any, start: Callable[[], Sequence[Any]], count: int) -> list[Any]:
        return [future_of(started) for started in start()]

    def run(self, group: Any, action: Callable[[], T]) -> T:
        return action()

    def close(self) -> None:
        pass
