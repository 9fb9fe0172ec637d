"""Start N rank processes of a worker as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

A worker is a module of this package, named without the package (``"train_compare"``), or a
script file. Ranks are forked from one long-lived server process that imported torch once
(multiprocessing's forkserver, torch preloaded): each rank is still a new process with fresh
state, but it starts in milliseconds rather than the ~3 s an interpreter takes to import
torch. Tests about how an interpreter starts or ends (a ``sitecustomize``, what runs at exit
with gradients in flight) pass ``fresh=True`` and get real interpreters.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent  # on sys.path (pyproject's pytest pythonpath): this package is ``workers``
PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch.optim", "torch.utils.data",
           "torch._dynamo"]  # imported by DDP's and gradsched's constructors (1.5 s)
_forkserver = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server():
    """The forkserver context, with torch imported in the server once (started on first use).
    The server inherits this process's environment when it starts: one intra-op thread."""
    global _forkserver
    if _forkserver is None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        _forkserver = multiprocessing.get_context("forkserver")
        _forkserver.set_forkserver_preload(PRELOAD)
    return _forkserver


def _as_rank(worker: str, argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked rank: become ``python WORKER ARGV...`` with ``env``, then end as an
    interpreter ends (traceback, non-daemon threads joined, atexit handlers) with its code."""
    import atexit
    import runpy
    import threading
    import traceback

    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.environ.clear()
    os.environ.update(env)
    import torch.distributed as dist

    dist.set_debug_level_from_env()  # torch.distributed read TORCH_DISTRIBUTED_DEBUG at import
    code = 0
    try:
        if worker.endswith(".py"):
            sys.argv = [worker, *argv]
            sys.path.insert(0, os.path.dirname(worker))
            runpy.run_path(worker, run_name="__main__")
        else:
            sys.argv = [str(HERE / f"{worker}.py"), *argv]
            runpy.run_module(f"workers.{worker}", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Forked:
    """One forked rank, read as a finished subprocess is read."""

    def __init__(self, worker: str, argv: list[str], env: dict[str, str], folder: Path):
        self.args = [worker, *argv]
        self.out, self.err = folder / "stdout", folder / "stderr"
        self.process = _server().Process(target=_as_rank, args=(worker, argv, env, str(self.out), str(self.err)))
        self.process.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def wait(self, timeout: float) -> bool:
        self.process.join(timeout)
        return self.process.exitcode is not None

    def kill(self) -> None:
        self.process.kill()
        self.process.join()

    def result(self) -> subprocess.CompletedProcess:
        read = lambda path: path.read_text(errors="replace") if path.exists() else ""  # noqa: E731
        return subprocess.CompletedProcess(self.args, self.process.exitcode, read(self.out), read(self.err))


class _Fresh:
    """One rank as a new interpreter."""

    def __init__(self, worker: str, argv: list[str], env: dict[str, str]):
        command = [worker] if worker.endswith(".py") else ["-m", f"workers.{worker}"]
        env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen([sys.executable, *command, *argv], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.done: subprocess.CompletedProcess | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def wait(self, timeout: float) -> bool:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self.done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)
        return True

    def kill(self) -> None:
        self.proc.kill()
        out, err = self.proc.communicate()
        self.done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def result(self) -> subprocess.CompletedProcess:
        return self.done


def start_ranks(worker: str, world: int, *args: str, folder: str, env: dict | None = None, fresh: bool = False,
                port: int | None = None) -> list:
    """Start ``worker`` on ``world`` ranks and return at once: the ranks, each with ``wait(timeout)``,
    ``kill()`` and ``result()`` (a forked rank's output lands under ``folder``). An ``env`` that
    changes ``PYTHONPATH`` needs a new interpreter, and gets one. :func:`run_ranks` starts and
    waits; a server of many tests (tests/distributed/programs.py) starts and talks to them."""
    port = port or free_port()
    fresh = fresh or "PYTHONPATH" in (env or {})
    ranks = []
    for rank in range(world):
        renv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env or {}))
        if fresh:
            ranks.append(_Fresh(worker, list(args), renv))
        else:
            (Path(folder) / str(rank)).mkdir(parents=True, exist_ok=True)
            ranks.append(_Forked(worker, list(args), renv, Path(folder) / str(rank)))
    return ranks


def run_ranks(worker: str, world: int, *args: str, timeout: float = 120.0, env: dict | None = None,
              agent_store: bool = False, fresh: bool = False) -> list[subprocess.CompletedProcess]:
    """Run ``worker`` on ``world`` ranks; return their results (stdout, stderr, exit code).

    With ``agent_store`` the job's key-value store is hosted here, as torchrun's agent hosts it,
    so that it outlives every rank; else rank 0 hosts it (``init_process_group``'s env://). An
    ``env`` that changes ``PYTHONPATH`` needs a new interpreter, and gets one."""
    port = free_port()
    store = None
    if agent_store:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)  # lives to the end
        env = dict(env or {}, TORCHELASTIC_USE_AGENT_STORE="True")
    with tempfile.TemporaryDirectory(prefix="ranks-") as folder:
        ranks = start_ranks(worker, world, *args, folder=folder, env=env, fresh=fresh, port=port)
        deadline = time.monotonic() + timeout
        for rank in ranks:
            if not rank.wait(max(1.0, deadline - time.monotonic())):
                for r in ranks:
                    r.kill()
                raise AssertionError(f"ranks did not finish within {timeout} s (hang?)\n{rank.result().stderr[-3000:]}")
        results = [rank.result() for rank in ranks]
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
    examples under torchrun, tests/runtime/test_exit.py; docs/internals.md "Ending with collectives in flight")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_worker(worker: str, tmp_path: Path) -> dict:
    """Run an integration worker (``with_lightning`` ...: ``OUT.json DIR``) on 2 gloo ranks and
    read the report rank 0 wrote."""
    import json

    out = tmp_path / "out.json"
    for r in run_ranks(worker, 2, str(out), str(tmp_path), timeout=600):
        assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())
