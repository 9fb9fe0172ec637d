"""sharded: one NCCL rank, ``architecture="sharded"`` and ``"fully_sharded"`` on CUDA tensors
against DDP, every policy (fifo and prophet with --quick).

With one rank the reduce-scatter and the all-gathers move nothing between ranks, but they take
NCCL's whole path: ``reduce_scatter_tensor`` in place on the communicator's stream, this rank's
part copied into its shard's gradient by a callback of the future; ``all_gather_into_tensor``
into a buffer the same kind of callback copies into the parameters, that buffer held until the
training thread waited for it and its use recorded on the callback's stream (the caching
allocator's ``record_stream``); under fully sharded, each unit gathered on a stream of its own
after the training stream's step, and freed by the training thread with its use recorded
there. A layer ahead of every other sleeps on the training stream in each forward pass, so the
host runs ahead of the device and a read or a free not ordered after its producer sees what is
not written yet. Checked:

* the parameters and the optimizer's moments (``full_state_dict()``: joined over NCCL) after
  ``STEPS`` AdamW steps (two parameter groups, a BatchNorm) against DDP's, at ``TOLERANCE``;
  every value finite;
* the messages took NCCL's path (no point-to-point operations);
* on CUDA, the bytes allocated at the peak of each (shown: with one rank nothing is sharded away).

On CPU the part runs on gloo with NCCL's semantics emulated (``GRADSCHED_EMULATE_NCCL``), which
takes the same path (tests/distributed/test_nccl_semantics.py catches a gather buffer let go of
early there)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gpucheck.common import POLICIES, SMALL, TOLERANCE, Net, batches, coordinator_of, device_sleep, row, sync

STEPS = 6
LAG_S = 0.005  # the training stream's sleep in every forward pass


class Lagging(nn.Module):
    """``Net`` behind a device sleep on the training stream."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.net = Net(width=64)
        self.device = device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_sleep(self.device, LAG_S)
        return self.net(x)


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def _train(model: nn.Module, data: list) -> torch.optim.Optimizer:
    optimizer = _optimizer(model)
    for x, y in data:
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


def _moments(saved: dict) -> list[torch.Tensor]:
    """Each parameter's ``exp_avg`` and ``exp_avg_sq`` in an optimizer's ``state_dict()``, by position."""
    return [saved["state"][position][key].detach().float().cpu().reshape(-1).clone()
            for position in sorted(saved["state"]) for key in ("exp_avg", "exp_avg_sq")]


def _whole(model: nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {n.removeprefix("module."): (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()
            for n, t in state.items()}


def _peak(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    sync(device)
    return torch.cuda.max_memory_allocated(device)


def _reset(device: torch.device) -> None:
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)


def part_sharded(device: torch.device, quick: bool) -> list[dict]:
    data = batches(device, STEPS)
    torch.manual_seed(0)
    initial = Lagging(device).to(device)
    _reset(device)
    reference = TorchDDP(copy.deepcopy(initial))
    ref_opt = _train(reference, data)
    peaks = {"ddp": _peak(device)}
    expected, expected_moments = _whole(reference), _moments(ref_opt.state_dict())
    del reference, ref_opt
    rows = []
    for architecture in ("sharded", "fully_sharded"):
        for policy in (("fifo", "prophet") if quick else POLICIES):
            _reset(device)
            model = gradsched.DistributedDataParallel(copy.deepcopy(initial), architecture=architecture, policy=policy,
                                                      policy_options=SMALL[policy], fallback=False)
            optimizer = _train(model, data)
            model.synchronize()
            peaks[f"{architecture} {policy}"] = _peak(device)
            pairwise = coordinator_of(model).backend.stepping.shards.pairwise
            got, moments = _whole(model), _moments(model.optimizer.full_state_dict())  # (NCCL's gather)
            finite = all(bool(torch.isfinite(t).all()) for t in [*got.values(), *moments])
            diff = max(max((got[n] - e).abs().nan_to_num(float("inf")).max().item() for n, e in expected.items()),
                       max((m - e).abs().nan_to_num(float("inf")).max().item()
                           for m, e in zip(moments, expected_moments)))
            model.close()
            rows.append(row(f"sharded {architecture} {policy} against DDP",
                            diff <= TOLERANCE and finite and pairwise is None,
                            f"{STEPS} AdamW steps: parameters, buffers and moments max |diff| {diff:.2e}; "
                            f"{'no NaN' if finite else 'NaN read'}; "
                            f"{'NCCL collectives' if pairwise is None else 'point-to-point (not NCCL path)'}",
                            max_abs_diff=diff, finite=finite, nccl_path=pairwise is None))
    if device.type == "cuda":
        rows.append(row("sharded peak memory", None, ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in peaks.items()),
                        peak_bytes=peaks))
    return rows
