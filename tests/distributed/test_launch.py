"""The test launcher (tests/workers/launch.py): a rank forked from its server behaves as the
same program started in a new interpreter does: ``__name__``, arguments, environment, one
intra-op thread, torch's debug level from the environment, non-daemon threads joined and
atexit handlers run at the end, the exit code and the traceback of an exception."""

from __future__ import annotations

import json

import pytest

from workers.launch import run_ranks


def seen(results) -> list[tuple]:
    return [(r.returncode, [json.loads(line) if line.startswith("{") else line for line in r.stdout.splitlines()],
             r.stderr.strip().splitlines()[-1:] if r.returncode else []) for r in results]


@pytest.mark.parametrize("code", ["5", "raise"])
def test_a_forked_rank_starts_and_ends_as_an_interpreter_does(code):
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    forked, fresh = (seen(run_ranks("probe", 2, code, env=env, fresh=f, timeout=60)) for f in (False, True))
    assert forked == fresh
    first = {"name": "__main__", "argv": [code], "threads": 1, "debug": "DebugLevel.DETAIL"}
    assert forked[0] == (0, [dict(first, rank="0"), "thread joined", "atexit ran"], [])
    assert forked[1][0] == (5 if code == "5" else 1) and forked[1][1][1:] == ["thread joined", "atexit ran"]
    if code == "raise":
        assert forked[1][2] == ["RuntimeError: rank 1 raised"]
