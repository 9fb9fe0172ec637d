"""Peak memory per rank, in units of the parameters' bytes, of every way gradsched and torch
train the same model data-parallel: the table of docs/memory.md.

    python benchmarks/memory_table.py                       # every arm, the table
    python benchmarks/memory_table.py --arms ddp-view,prophet --json out.json
    python benchmarks/memory_table.py --table docs/figures/memory.json  # the table of docs/memory.md

An MLP of six 3072-wide layers (56.6M parameters, P = 226 MB in float32), AdamW, 2 gloo ranks
on loopback, batch 32, 8 steps. Each arm runs in fresh processes (one intra-op thread each);
its figures are rank 0's resident set's high-water mark above its resident set before the
model was built (gradsched.bench.memory.PeakMemory) and the most bytes allocated at once
above what was allocated then (gradsched.bench.memory.HeapPeak, the allocator's own count:
steadier, and blind to what the allocator keeps), each divided by P, both taken when the
training ends (before a wrapper's close(), which under fully sharded gathers every parameter
whole again: FSDP2's arm likewise joins its parameters after). Beside them: what the arm
must hold at least, in words and in P (parameters, gradients, buckets, optimizer state, what
its budgets allow), how far its allocated peak is above that (what every arm holds besides:
the optimizer's temporaries, the gradient autograd is computing, the inputs and the process
group's own buffers), and the largest difference of its parameters from DDP's after the run.
The arm ``alone`` trains the model in one process on both ranks' batches (the gradients DDP
averages): what torch itself holds above the model's tensors, with no data parallelism.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WIDTH, LAYERS, BATCH, STEPS, WORLD = 3072, 6, 32, 8, 2

LAYER = 1 / LAYERS  # one layer's parameters (or gradients), in P
#: arm -> (what it must hold at least, as words; the same in P)
ARMS = {
    "ddp": ("params 1 + grads 1 + buckets 1 + AdamW 2", 5),
    "alone": ("params 1 + grads 1 + AdamW 2 (one process, both ranks' batches: no data parallelism)", 4),
    "ddp-view": ("params 1 + grads 1 + AdamW 2", 4),
    "ddp-zero": ("params 1 + grads 1 + buckets 1 + AdamW 1", 4),
    "fsdp2": ("params 1/2 + grads 1/2 + AdamW 1 + one layer gathered", 2 + LAYER),
    "fsdp2-noreshard": ("params 1/2 + AdamW 1 + every layer gathered from forward to backward", 2.5),
    "fifo": ("params 1 + grads 1 + AdamW 2", 4),
    "bytescheduler": ("params 1 + grads 1 + AdamW 2", 4),
    "prophet": ("params 1 + grads 1 + AdamW 2", 4),
    **{f"{policy}-sharded": ("params 1 + grads 1/2 + AdamW 1 + two layers waiting for the link (the default budget: "
                             "the credit window)", 2.5 + 2 * LAYER) for policy in ("fifo", "bytescheduler", "prophet")},
    **{f"{policy}-fully_sharded": ("params 1/2 + grads 1/2 + AdamW 1 + one layer gathered, two waiting for the link "
                                   "(the default budgets)", 2 + 3 * LAYER) for policy in ("fifo", "prophet")},
    "prophet-fully_sharded-lean": ("params 1/2 + grads 1/2 + AdamW 1 + one layer gathered, one waiting for the link "
                                   "(gradient_budget_mb: a layer)", 2 + 2 * LAYER),
}
LAYER_MB = (WIDTH * WIDTH + WIDTH) * 4 / 2**20  # one layer's parameters (or gradients), in MiB


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _rank(rank: int, arm: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from gradsched.bench.memory import HeapPeak, PeakMemory

    memory, heap = PeakMemory(), HeapPeak()
    memory.start()
    heap.start()
    model = _model()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    generator = torch.Generator().manual_seed(1 + rank)
    batches = lambda: torch.randn(BATCH, WIDTH, generator=generator)  # noqa: E731
    if arm == "alone":  # the same gradients as DDP's average: the mean loss over both ranks' batches
        generators = [torch.Generator().manual_seed(1 + r) for r in range(WORLD)]
        batches = lambda: torch.cat([torch.randn(BATCH, WIDTH, generator=g) for g in generators])  # noqa: E731
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    elif arm.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, gradient_as_bucket_view=arm == "ddp-view")
        if arm == "ddp-zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    elif arm.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer, reshard_after_forward=arm == "fsdp2")
        fully_shard(model, reshard_after_forward=arm == "fsdp2")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        import gradsched

        policy, _, architecture = arm.partition("-")
        architecture, _, variant = architecture.partition("-")
        lean = dict(gradient_budget_mb=LAYER_MB) if variant == "lean" else {}
        model, optimizer = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-4), policy=policy,
                                          architecture=architecture or "allreduce", **lean)
    for _ in range(STEPS if arm != "alone" or rank == 0 else 0):
        x = batches()
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    peak, heap_peak = memory.stop(), heap.stop()  # training's peak: close() may gather parameters whole again
    if hasattr(optimizer, "close"):
        optimizer.close()
    state = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
             for name, p in model.named_parameters()}
    if rank == 0:
        torch.save({"peak_bytes": peak, "heap_peak_bytes": heap_peak, "param_bytes": params,
                    "params": {n.removeprefix("module."): v for n, v in state.items()}}, out)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(arm: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        mp.start_processes(_rank, args=(arm, _free_port(), out), nprocs=WORLD, start_method="spawn")
        return torch.load(out)


HEADER = ["| arm | peak (P) | allocated at most (P) | must hold at least | (P) | allocated above it (P) "
          "| max abs diff from DDP |",
          "|---|---:|---:|---|---:|---:|---:|"]


def row(arm: str, result: dict) -> str:
    diff, heap = result["max_abs_diff_from_ddp"], result.get("heap_peak_p")
    words, least = ARMS[arm]
    return (f"| {arm} | {result['peak_p']:.2f} | {'-' if heap is None else f'{heap:.2f}'} | {words} | {least:.2f} | "
            f"{'-' if heap is None else f'{heap - least:+.2f}'} | {'-' if diff is None else f'{diff:.1e}'} |")


def table(data: dict) -> str:
    """The table of a saved run (``--json``)."""
    return "\n".join(HEADER + [row(arm, result) for arm, result in data["arms"].items()]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--table", help="print the table of a saved run, and run nothing")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)), end="")
        return
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    results, reference = {}, None
    print(*HEADER, sep="\n")
    for arm in arms:
        got = measure(arm)
        if arm == "ddp":
            reference = got["params"]
        diff = None if reference is None else max(
            (got["params"][n] - v).abs().max().item() for n, v in reference.items())
        heap = got.get("heap_peak_bytes")
        results[arm] = {"peak_p": got["peak_bytes"] / got["param_bytes"], "param_bytes": got["param_bytes"],
                        "heap_peak_p": None if heap is None else heap / got["param_bytes"],
                        "peak_bytes": got["peak_bytes"], "max_abs_diff_from_ddp": diff}
        print(row(arm, results[arm]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setting": {"width": WIDTH, "layers": LAYERS, "batch": BATCH, "steps": STEPS,
                                   "world": WORLD}, "arms": results}, f, indent=1)


if __name__ == "__main__":
    main()
