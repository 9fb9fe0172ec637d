"""Multi-node launch as users do it: one ``torchrun --nnodes 2 --node-rank i --nproc-per-node 2
--rdzv-backend c10d --rdzv-endpoint HOST:PORT`` per host, each host a network namespace of
the emulated cluster with its link limited by tc. The example trains across the two hosts to
the parameters of a one-host run of the same four ranks. Namespaces are removed afterwards."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ELASTIC_EXAMPLE, moved_by_elastic_example

from gradsched.bench import EmulatedCluster
from gradsched.bench.netns import PREFIX
from gradsched.bench.processes import torchrun_host
from netns_helpers import needs_netns

EXAMPLE = ELASTIC_EXAMPLE
STEPS = ["--steps", "40", "--every", "1000", "--policy", "bytescheduler"]


def _torchrun(nnodes: int, node_rank: int, nproc: int, endpoint: str, tmp_path: Path, tag: str,
              address: str = "127.0.0.1") -> list[str]:
    return [*torchrun_host(nnodes, node_rank, nproc, endpoint, address, tag), str(EXAMPLE),
            "--checkpoint", str(tmp_path / f"{tag}.pt"), "--out", str(tmp_path / f"{tag}-final.pt"), *STEPS]


@pytest.mark.slow  # CI: the bench's timeout test launches the same torchrun hosts and cleans them up
@needs_netns
def test_two_hosts_of_two_processes_train_as_one_host_of_four(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    with EmulatedCluster(2, 2e9, run_id="t7") as cluster:
        # host 0's address: its torchrun hosts the rendezvous store. A namespace shares the
        # machine's hostname, which does not resolve to the namespace's address, so each
        # torchrun is told its address (--local-addr, what the others connect to) and whether
        # it hosts the store (--rdzv-conf is_host) instead of guessing both from the hostname
        endpoint = f"{cluster.addresses[0]}:29470"
        hosts = [subprocess.Popen(cluster.command(i, _torchrun(2, i, 2, endpoint, tmp_path, "hosts",
                                                               cluster.addresses[i])), env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                  start_new_session=True)
                 for i in range(2)]
        try:
            results = [host.communicate(timeout=240) for host in hosts]
        finally:  # a hang must not leave ranks behind
            for host in hosts:
                if host.poll() is None:
                    os.killpg(host.pid, signal.SIGKILL)
                    host.communicate()
    for host, (out, err) in zip(hosts, results):
        assert host.returncode == 0, err[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    one = subprocess.run(_torchrun(1, 0, 4, f"127.0.0.1:{port}", tmp_path, "one"), env={**env, "GLOO_SOCKET_IFNAME": "lo"},
                         capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    across, alone = torch.load(tmp_path / "hosts-final.pt"), torch.load(tmp_path / "one-final.pt")
    for name in alone:
        # four ranks: plans made from each run's own timings may cut messages differently, and
        # the all-reduce then sums in another order; 1e-6 is far below what training moved
        assert torch.allclose(across[name], alone[name], rtol=0, atol=1e-6), name
    assert moved_by_elastic_example(alone) > 1e-2



@pytest.mark.slow  # CI: the two-host training test above launches the same torchruns
@needs_netns
def test_the_bench_runs_hosts_of_several_ranks():
    """``--nodes 2 --procs-per-node 2``: four ranks in two namespaces, two sharing each link,
    each host started with its own torchrun."""
    out = subprocess.run([sys.executable, "-m", "gradsched", "bench", "--model", "replay-mini", "--nodes", "2",
                          "--procs-per-node", "2", "--bandwidth", "2Gbit", "--iters", "3", "--warmup", "1",
                          "--policy", "ddp,bytescheduler", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["workers"] == 4 and data["procs_per_node"] == 2 and data["emulated_network"]
    assert data["launcher"] == "torchrun"
    assert [r["policy"] for r in data["results"]] == ["ddp", "bytescheduler"]
    assert data["results"][1]["predicted_s"] > 0
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(PREFIX)]
