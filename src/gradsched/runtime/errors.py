"""The runtime's error type, and the translation of collective failures into it."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_ENTRY: ContextVar[str] = ContextVar("gradsched_entry", default="gradsched.wrap")


def entry() -> str:
    """What the user called, for error messages: ``gradsched.wrap`` unless a caller said otherwise."""
    return _ENTRY.get()


@contextmanager
def entered_through(name: str) -> Iterator[None]:
    """Errors raised inside name ``name`` as the call the user made (``gradsched.DistributedDataParallel``)."""
    token = _ENTRY.set(name)
    try:
        yield
    finally:
        _ENTRY.reset(token)


class GradschedError(RuntimeError):
    """Communication failed or gradsched was misused; the message says which and how to fix it."""


@contextmanager
def failing_rank(what: str, explain: Callable[[], str] | None = None) -> Iterator[None]:
    """Report a collective that failed because a peer died or hung as a GradschedError,
    with what ``explain`` adds (the other ranks' progress, :mod:`gradsched.runtime.diagnostics.peer_status`)."""
    try:
        yield
    except GradschedError:
        raise
    except RuntimeError as exc:  # gloo and NCCL report a dead or stuck peer as RuntimeError
        more = explain() if explain is not None else ""
        raise GradschedError(f"{what} failed: another rank died or is unreachable ({exc}){more}") from exc
