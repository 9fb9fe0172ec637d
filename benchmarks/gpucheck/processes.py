"""Running one part of the GPU check in fresh processes, each with its own time limit.

Processes are forked from a server that imported torch once and never touched CUDA
(multiprocessing's forkserver): fresh processes, without an interpreter's start-up per part.
NCCL allows one rank per GPU, so the parts that need a reduction that is not the identity
run two gloo ranks with CUDA tensors on the one GPU; the others run one NCCL rank (on CPU:
gloo, with the environment the part asks for, such as NCCL's semantics emulated)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpucheck.common import row
from gpucheck.parts import PARTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, backend: str, device: str, part: str, quick: bool,
               out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    if device == "cpu":
        os.environ.update(PARTS[part].env or {})
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group(backend)
    try:
        result = PARTS[part].run(torch.device(device, 0) if device == "cuda" else torch.device("cpu"), quick)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def run_part(part: str, device: str, quick: bool, timeout_s: float) -> list[dict]:
    """Run one part on fresh processes; its rows (a failed or hung part is one failed row)."""
    spec = PARTS[part]
    backend = "nccl" if spec.backend == "nccl" and device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        context = mp.start_processes(_rank_main, (spec.world, free_port(), backend, device, part, quick, out),
                                     spec.world, join=False, start_method="forkserver")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    return [row(part, False, f"did not finish within {timeout_s:.0f} s")]
        except Exception as exc:  # noqa: BLE001 - a rank raised: reported as the part's failure
            return [row(part, False, f"a rank failed: {str(exc)[-1500:]}")]
        with open(out) as f:
            return json.load(f)
