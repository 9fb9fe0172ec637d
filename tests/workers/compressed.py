"""Worker: every policy with compression="bf16"/"fp16" against DDP with the matching
compression hook (PyTorch's fp16_compress_hook; for bf16, gradsched's equivalent, since
PyTorch's bf16_compress_hook needs CUDA and NCCL). Rank 0 writes the largest difference.

    python -m workers.compressed OUT.json [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from gradsched.runtime.comm.compression import ddp_hook
from workers.launch import finish_with_report
from workers.train_compare import SMALL, Net, batches, make_optimizer, train

HOOKS = {"fp16": fp16_compress_hook, "bf16": ddp_hook(torch.bfloat16)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    data = batches(dist.get_rank(), args.steps)
    report = {"cases": {}, "moved": {}, "error": {}, "ddp_error": {}}

    def mean_error(params, reference) -> float:
        """The mean absolute difference over every parameter element."""
        flat = torch.cat([(p.detach() - r).abs().reshape(-1) for p, r in zip(params, reference)])
        return flat.mean().item()

    def ddp_run(hook) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = Net()
        ddp = DDP(model)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opt, _ = make_optimizer("sgd", model)
        train(ddp, opt, None, data)
        return [p.detach().clone() for p in model.parameters()]

    uncompressed = ddp_run(None)
    report["ours_fp16_hook_vs_torchs"] = max(
        (a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(ddp_run(ddp_hook(torch.float16)), ddp_run(fp16_compress_hook)))
    for compression, hook in HOOKS.items():
        reference = ddp_run(hook)
        report["moved"][compression] = max((a - b).abs().nan_to_num(float("inf")).max().item() for a, b in zip(reference, uncompressed))
        report["ddp_error"][compression] = mean_error(reference, uncompressed)
        for policy in ("fifo", "priority", "bytescheduler", "prophet"):
            torch.manual_seed(0)
            model = Net()
            opt, _ = make_optimizer("sgd", model)
            model, opt = gradsched.wrap(model, opt, policy, policy_options=SMALL[policy], compression=compression,
                                        fallback=False, profile_rounds=2, replan_every=2)
            train(model, opt, None, data)
            opt.synchronize()
            report["cases"][f"{compression}/{policy}"] = max(
                (p.detach() - r).abs().nan_to_num(float("inf")).max().item() for p, r in zip(model.parameters(), reference))
            report["error"][f"{compression}/{policy}"] = mean_error(model.parameters(), uncompressed)
            opt.close()
    finish_with_report(args.out, report)


if __name__ == "__main__":
    main()
