"""The GPU check: what gradsched's CUDA path must do on one GPU, part by part, each able to fail.

On the lent machine (one GPU, its own CUDA build of torch, no package index), from the
repository's root, one command, under 8 minutes (the parts get --budget, 450 s, and the
machine's start the rest; their limits add up to 705 s, so the last ones are skipped if the
first run long; not yet run on a GPU):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_check.py --json $OUT/gpu-check.json

with the folder .whl carried: the one wheel gradsched needs that such a machine lacks, msgspec,
fetched here beforehand by ``make gpu-wheels`` (a few hundred kB; .whl is ignored by git).
Then copy the JSON to docs/figures/gpu-check.json. On CPU, the same code on gloo:

    python benchmarks/gpu_check.py --device cpu [--quick]

Parts, in the order they run (each in fresh processes, with its own time limit; NCCL allows one
rank per GPU, so parts that need a reduction that is not the identity run two gloo ranks with
CUDA tensors on the one GPU, the others one NCCL rank):

  nccl        1 NCCL rank: the reduction made visible (a hook multiplies by 4 behind device
              sleeps): a read right after backward(), the update the next forward pass sees,
              two backward passes before one step, exact; NaN-filled reused memory never read.
              On CPU: gloo with NCCL's completion semantics emulated.
  reduction   2 ranks, different data, every policy, fp32 and fp16 on the wire, and over a slow
              link: gradients read on a third stream right after backward(); the communication
              threads' streams are not the default stream.
  streams     gradsched's streams are none of the 128 that torch's pool hands out after it.
  handoff     2 ranks, buckets kept and handed to DDP's reducer: values, flat buffers freed,
              memory held against DDP's measured alike.
  steady      1 rank, a slow link, no drain inside the loop: bytescheduler against fifo.
  overlap     1 rank, a slow link: the share of its delay hidden behind backward, against DDP.
  sync_bn     2 ranks: SyncBatchNorm (the user's collectives beside gradsched's) against DDP.
  sharded     1 NCCL rank: sharded and fully sharded on CUDA against DDP, every policy, NCCL's
              reduce-scatter and all-gathers (on CPU: gloo with NCCL's semantics emulated).
  end_to_end  1 rank, every policy against DDP: AMP, fused AdamW, BatchNorm, unused
              parameters, join(), export_profile, device_ids moving CPU inputs.
  profile     1 rank: a layer that sleeps known times is found with them in the profile.
  host_syncs  1 rank: CUDA synchronizations per iteration on the training thread against DDP.
  overhead    1 rank, ResNet-50: time per iteration and peak memory against DDP.

Each part's rows are written to --json as it ends; a part that cannot finish in what is left of
--budget is skipped (its row says so), so a run cut off still returns what it measured. Rows
are judged only where the device makes the judgement mean something (the CUDA-only ones show
``-`` on CPU). Exit status 1 if a check failed. tests/bench/test_gpu_check.py runs the CPU
version and shows the planted defects (tests/mutant) failing their rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.multiprocessing as mp

import gradsched
from gpucheck.common import row
from gpucheck.parts import PARTS
from gpucheck.processes import run_part

BUDGET_S = 450.0  # the lent machine: under 8 minutes with its start


def _write(path: str | None, setting: dict, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"setting": setting, "rows": rows}, f, indent=1)


def _print(setting: dict, rows: list[dict]) -> None:
    width = max(len(r["check"]) for r in rows)
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "  - "}[r["ok"]]
        print(f"{r['check']:<{width}}  {verdict}  {r['detail']}")
    print(f"{setting['device']}, torch {setting['torch']}: {setting['seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and cases")
    parser.add_argument("--json", help="write the rows and the setting here, after each part")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help=f"seconds for all parts; a part that may not finish in what is left is skipped "
                             f"(default {BUDGET_S:.0f})")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu for the CPU version of the checks",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    mp.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "gradsched.runtime", "gpucheck.parts"])
    setting = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "gradsched": gradsched.__version__, "parts": parts,
               "budget_s": args.budget, "mutant": os.environ.get("GRADSCHED_MUTANT"), "seconds": 0.0}
    rows: list[dict] = []
    for part in parts:
        spec = PARTS[part]
        left = args.budget - (time.monotonic() - started)
        part_started = time.monotonic()
        if left < spec.timeout_s:
            got = [row(part, None, f"skipped: {left:.0f} s of the budget left, it may take {spec.timeout_s:.0f}")]
        else:
            print(f"gpu_check: {part} ({spec.world} rank{'s' if spec.world > 1 else ''}, limit {spec.timeout_s:.0f} s)"
                  " ...", file=sys.stderr, flush=True)
            got = run_part(part, args.device, args.quick, spec.timeout_s)
        for r in got:
            r["part"], r["part_s"] = part, time.monotonic() - part_started
        rows += got
        setting["seconds"] = time.monotonic() - started
        _write(args.json, setting, rows)
    _print(setting, rows)
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
