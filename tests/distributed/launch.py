"""Start N real processes of a script as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, world: int, *args: str, timeout: float = 120.0,
              env: dict | None = None, agent_store: bool = False) -> list[subprocess.CompletedProcess]:
    """Run ``script`` (a file next to this one) on ``world`` ranks; return their results.

    With ``agent_store`` the job's key-value store is hosted here, as torchrun's agent hosts it,
    so that it outlives every rank; else rank 0 hosts it (``init_process_group``'s env://)."""
    port = free_port()
    store = None
    if agent_store:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)  # lives to the end
        env = dict(env or {}, TORCHELASTIC_USE_AGENT_STORE="True")
    procs = []
    for rank in range(world):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, str(HERE / script), *args], env=penv,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, err = proc.communicate()
            raise AssertionError(f"ranks did not finish within {timeout} s (hang?)\n{err[-3000:]}")
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    del store
    return results


def finish_with_report(path: str, report: object) -> None:
    """Rank 0 writes ``report`` to ``path`` as JSON; then every rank leaves the process group
    and ends with :func:`finish`."""
    import json

    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()
    finish()


def finish_with_every_report(path: str, report: object) -> None:
    """Every rank's ``report``, gathered (a list in rank order) and written by rank 0 as JSON;
    then as :func:`finish_with_report`."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    finish_with_report(path, gathered)


def finish() -> None:
    """End a worker script once its results are written and its process group destroyed:
    flush and leave without the interpreter's shutdown, so that each test checks what it is
    about. How scripts end at exit is tested on its own (test_ending_in_flight.py, the
    examples under torchrun, tests/runtime/test_exit.py; docs/runtime.md "End cleanly")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
