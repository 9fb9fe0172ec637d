"""gradsched.runtime.comm.board: who is woken when. The training thread's wait for reductions
is woken when a gradient it waits for is reduced, not at every message's end (each wake-up
takes the interpreter from the threads that do work), and at once when anything fails."""

from __future__ import annotations

import threading

import torch

from gradsched.core.task import TensorSpec
from gradsched.runtime.comm.board import Board
from gradsched.runtime.device.host import HostDevice


def _board() -> Board:
    specs = [TensorSpec(name, 4, i, i) for i, name in enumerate("abc")]
    return Board(specs, [torch.zeros(4) for _ in specs], HostDevice())


def _waiter(board: Board, wanted: set[int], timeout_s: float) -> tuple[threading.Thread, list, threading.Event]:
    """A thread that waits on ``board.reduced`` for ``wanted`` once: whether it was woken (True)
    or timed out (False); the event is set once it waits (the lock released)."""
    woken: list = []
    waiting = threading.Event()

    def wait() -> None:
        with board.cond:
            board.wanted.append(wanted)
            waiting.set()
            woken.append(board.reduced.wait(timeout_s))
            board.wanted.remove(wanted)

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(10)
    return thread, woken, waiting


def test_a_reduction_wakes_only_a_waiter_that_waits_for_one_of_its_gradients():
    board = _board()
    thread, woken, _ = _waiter(board, {0}, timeout_s=0.3)
    with board.cond:  # held by the waiter until it waits: it waits now
        board.reduced_now([1, 2])  # not what it waits for
    thread.join()
    assert woken == [False]  # timed out: nothing woke it

    thread, woken, _ = _waiter(board, {0, 2}, timeout_s=30)
    with board.cond:
        board.reduced_now([2])
    thread.join()
    assert woken == [True] and board.wanted == []


def test_a_failure_wakes_every_waiter_at_once():
    board = _board()
    thread, woken, _ = _waiter(board, {0}, timeout_s=30)
    board.fail(RuntimeError("a peer went away"))
    thread.join()
    assert woken == [True] and board.stopping
