"""The abort at interpreter exit ("terminate called without an active exception"), its cause
and its fix (ending.py, 2 gloo ranks).

A script that ends while a collective of gradsched's is still in flight leaves, in gloo's
worker thread, the Python callback chained on that collective's future. When the peer
completes the collective during the interpreter's finalization, that thread takes the GIL to
run the callback; CPython ends such a thread with pthread_exit, whose forced unwinding
through gloo's C++ frames calls std::terminate. gradsched's exit handler closes what is
open and destroys its process groups, which waits for the collectives in flight while the
interpreter is whole. Without it (the handler unregistered) the same script aborts; with it,
it never does.
"""

from __future__ import annotations

import pytest

from workers.launch import run_ranks

ABORT = "terminate called without an active exception"


def ended(delay: float, *extra: str) -> list:
    return run_ranks("ending", 2, str(delay), *extra, timeout=120, fresh=True)  # how an interpreter ends


def test_a_script_that_ends_with_gradients_in_flight_exits_cleanly():
    for delay in (0.1, 0.5):  # rank 0's finalization under way when rank 1 completes the round
        for rank, result in enumerate(ended(delay)):
            assert result.returncode == 0 and ABORT not in result.stderr, (delay, rank, result.stderr[-2000:])
            assert f"rank {rank} ends" in result.stdout


@pytest.mark.slow  # CI: the test above, with the handler, is the contract
def test_without_the_exit_handler_the_same_script_aborts():
    """The contrast: the window is real, so the test above can fail."""
    results = [r for delay in (0.1, 0.3, 0.5) for r in ended(delay, "--without-exit-handler")]
    aborted = [r for r in results if r.returncode == -6 and ABORT in r.stderr]
    assert aborted, [(r.returncode, r.stderr[-300:]) for r in results]
