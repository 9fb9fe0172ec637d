"""The processes of one benchmark run: the command line of each rank (or of each emulated
host's torchrun), rank 0's progress and result, and stopping them all."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Callable

from .netns import EmulatedCluster
from .protocol import MARK


def script_args(parser: argparse.ArgumentParser, worker: Callable[[argparse.Namespace], None],
                table: Callable[[dict], str]) -> argparse.Namespace | None:
    """What a benchmark script that starts its own ranks (:func:`local_ranks`) shares: ``--json
    FILE`` (the figures kept), ``--table FILE`` (a kept run's table printed again) and its ranks'
    own ``--worker``. The arguments of a run to start, or None where the call was the worker's or
    a table's and is done."""
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    parser.add_argument("--table", metavar="FILE", help="print the table of a --json FILE and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return None
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)), end="")
        return None
    return args


def script_result(args: argparse.Namespace, data: dict, table: Callable[[dict], str]) -> None:
    """A run's figures written to ``--json`` (if given) and its table printed."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(table(data), end="")


def script_settings(args: argparse.Namespace) -> dict:
    """The options a run was made with, as its JSON keeps them."""
    return {k: v for k, v in vars(args).items() if k not in ("worker", "json", "table")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_ranks(argv: list[str], ranks: int, env: dict[str, str] | None = None) -> dict:
    """Run ``argv`` (a script and its arguments) as ``ranks`` processes of one job on this host
    (loopback rendezvous, one intra-op thread each, ``env`` added) and return what rank 0 printed
    last, as JSON: how the benchmarks' scripts run their own ranks."""
    port = free_port()
    procs = []
    for rank in range(ranks):
        rank_env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a rank failed")
    return json.loads(outputs[0].strip().splitlines()[-1])


def torchrun_host(nnodes: int, node_rank: int, nproc: int, endpoint: str, address: str, rdzv_id: str) -> list[str]:
    """One host's torchrun command line, to which the script and its arguments are appended.
    A host states its own address (``--local-addr``: a namespace shares the machine's
    hostname) and host 0 hosts the rendezvous (``is_host``), as docs/guide.md "Many hosts"
    tells users to."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id, "--rdzv-conf", f"is_host={str(node_rank == 0).lower()}", "--local-addr", address]


def starts(torchrun: bool, hosts: int, procs_per_node: int, cluster: EmulatedCluster | None, worker: list[str],
           master: str, port: int, stdout: int) -> list[tuple[int, list[str], dict[str, str], int]]:
    """(host, command, environment, stdout) of every process to start: one torchrun per host,
    or one process per rank; rank 0 (or host 0's torchrun) writes to ``stdout``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if cluster is not None:
        env["GLOO_SOCKET_IFNAME"] = cluster.interface
    if torchrun:  # as users launch across hosts: one torchrun per host; rank 0 is on any
        return [(host, torchrun_host(hosts, host, procs_per_node, f"{master}:{port}",
                                     "127.0.0.1" if cluster is None else cluster.addresses[host],
                                     f"bench{os.getpid()}") + worker, env, stdout)
                for host in range(hosts)]
    ranks = hosts * procs_per_node
    return [(rank // procs_per_node, [sys.executable, *worker],
             dict(env, RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank % procs_per_node),
                  LOCAL_WORLD_SIZE=str(procs_per_node),
                  MASTER_ADDR=master, MASTER_PORT=str(port)),
             stdout if rank == 0 else subprocess.DEVNULL) for rank in range(ranks)]


def read_result(reading: int, progress: Callable[[dict], None]) -> dict | None:
    """Rank 0's progress lines (passed on) and its result (returned), until it closes its stdout."""
    result = None
    for line in os.fdopen(reading, closefd=False):
        if line.startswith(MARK):
            message = json.loads(line[len(MARK):])
            if message["kind"] in ("progress", "finished"):  # a run begins; a run has finished
                progress(message)
            else:
                result = message
    return result


# what gloo says in a rank whose peer went away first (that peer's log says why)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


class Processes:
    """The processes of one benchmark run, their logs, and a way to stop them all."""

    def __init__(self, cluster: EmulatedCluster | None, torchrun: bool) -> None:
        self.cluster = cluster
        self.torchrun = torchrun
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.expired = threading.Event()

    def start(self, host: int, argv: list[str], env: dict[str, str], stdout: int) -> None:
        if self.cluster is not None:
            argv = self.cluster.command(host, argv)
        log = tempfile.TemporaryFile(mode="w+")
        self.logs.append(log)
        self.procs.append(subprocess.Popen(argv, env=env, stdout=stdout, stderr=log, text=True,
                                           start_new_session=True))

    def kill_all(self) -> None:
        self.expired.set()
        for proc in self.procs:
            if proc.poll() is None:  # torchrun stops its workers on SIGTERM (they run in sessions of their own)
                os.killpg(proc.pid, signal.SIGTERM if self.torchrun else signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if self.cluster is not None:
            self.cluster.kill_processes()  # anything left in the namespaces

    def failure(self, result: dict | None) -> str | None:
        """Why the run failed, or None: the log tail of the first failed process that did not fail
        only because a peer had gone (a rank whose peer crashed fails too, and first if it is rank 0)."""
        failed = [r for r, p in enumerate(self.procs) if p.returncode != 0]
        if not failed and result is not None:
            return None
        tails = {}
        for r in failed or [0]:
            self.logs[r].seek(0)
            tails[r] = self.logs[r].read()[-6000:]
        first = next((r for r, tail in tails.items() if not any(said in tail for said in PEER_GONE)), next(iter(tails)))
        who = f"{'host' if self.torchrun else 'rank'} {first}"
        return f"benchmark {who} failed:\n{tails[first]}"

    def close(self) -> None:
        self.kill_all()
        for proc in self.procs:
            proc.wait()
        for log in self.logs:
            log.close()


