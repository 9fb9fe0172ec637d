"""gradsched's module hooks, and what a saved model keeps of them.

``torch.save(model)`` pickles a module together with its hooks. gradsched's hooks belong to
a live coordinator (threads, process groups), which cannot be pickled and would mean nothing
in another process, so each one pickles as :class:`Detached`, a hook that does nothing: a
model with gradsched attached (``gradsched.wrap``'s, or the module inside
``gradsched.DistributedDataParallel``) saves and loads whole. A ``DistributedDataParallel``
loaded that way attaches a coordinator of its own (its ``__setstate__``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class Hook:
    """A module hook of a coordinator's: run untraced under ``torch.compile`` (it waits on other
    threads and reads clocks; one graph break each, docs/guide.md "torch.compile")."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = torch.compiler.disable(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return (Detached, ())


class Detached:
    """What a gradsched hook becomes in a saved model: nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None
