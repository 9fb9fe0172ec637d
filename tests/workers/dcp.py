"""Worker: torch.distributed.checkpoint round trips, as FSDP2's users make them.

``save``: a model trained 3 steps under ``--architecture`` (AdamW, two parameter groups, a
learning rate scheduler) saved with ``get_state_dict`` and ``dcp.save``; what it held is
written beside (rank 0: the model and the optimizer's whole state, ``ref.pt``), and it trains 2
steps more, uninterrupted (``final.pt``). ``load``: a fresh model (another initialisation)
under ``--architecture`` on however many ranks, a fresh optimizer, ``get_state_dict`` (which
makes its state with a step on zeros), ``dcp.load``, ``set_state_dict``; it reports how far the
model and the optimizer's whole state are from what was saved, and, with the save's ranks,
trains the same 2 steps and reports how far it ends from the uninterrupted run.

    python -m workers.dcp save|load FOLDER OUT.json --architecture A [--api ddp|wrap] [--model rows|edges]

``--model edges``: a weight of one row (empty shards on every rank but rank 0) and a
0-dimensional parameter.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import gradsched
from workers.launch import finish_with_every_report

STEPS, MORE = 3, 2


class Edges(nn.Module):
    """Shards that are not rows of every rank: a weight of one row (the other ranks' shards of it
    empty) and a 0-dimensional scale (rank 0's alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 1))
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.out = nn.Linear(1, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x) * self.scale)


def net(seed: int, model: str = "rows") -> nn.Module:
    torch.manual_seed(seed)  # rows: every row of every parameter a shard of its own under 2 or 3 ranks
    if model == "edges":
        return Edges()
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 6))


def wrapped(seed: int, architecture: str, api: str, kind: str = "rows"):
    """The model (``kind``) and the optimizer the user holds: gradsched's under ``architecture``,
    or PyTorch's own (``fsdp2``: ``fully_shard`` on every layer and the model; ``ddp``)."""
    model = net(seed, kind)
    if architecture == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(groups_of(model), lr=0.01)
    if architecture == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.AdamW(groups_of(model), lr=0.01)
    if api == "wrap":
        model, optimizer = gradsched.wrap(model, torch.optim.AdamW(groups_of(model), lr=0.01), "bytescheduler",
                                          architecture=architecture)
        return model, optimizer
    model = gradsched.DistributedDataParallel(model, policy="bytescheduler", architecture=architecture)
    return model, torch.optim.AdamW(groups_of(model), lr=0.01)


def groups_of(model: nn.Module) -> list[dict]:
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
            {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}]


def train(model, optimizer, steps: range) -> None:
    rank = dist.get_rank()
    for step in steps:
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 6, (16,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def whole(model: nn.Module, optimizer) -> tuple[dict, dict]:
    """The model's parameters and the optimizer's state, whole and keyed by name, as
    torch.distributed.checkpoint's full state dicts give them (collectives under sharding)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    params, optim = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return ({n: v.detach().clone() for n, v in params.items()},
            {n: {key: v.clone() for key, v in entry.items()} for n, entry in optim["state"].items()})


def groups(optimizer) -> list[dict]:
    """Each parameter group's options and how many parameters it holds."""
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": len(g["params"])}
            for g in optimizer.param_groups]


def distance(a: dict, b: dict) -> float:
    """Largest absolute difference between two nests of tensors (inf where their keys differ)."""
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            worst = max(worst, distance(x, y))
        else:
            worst = max(worst, (x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
    return worst


def save(folder: str, architecture: str, api: str, kind: str) -> dict:
    model, optimizer = wrapped(0, architecture, api, kind)
    train(model, optimizer, range(STEPS))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(folder, "checkpoint"))
    params, state = whole(model, optimizer)
    if dist.get_rank() == 0:
        torch.save({"params": params, "state": state, "groups": groups(optimizer)}, os.path.join(folder, "ref.pt"))
    train(model, optimizer, range(STEPS, STEPS + MORE))
    params, _ = whole(model, optimizer)
    if dist.get_rank() == 0:
        torch.save(params, os.path.join(folder, "final.pt"))
    close(model, optimizer, api)
    return {}


def load(folder: str, architecture: str, api: str, kind: str) -> dict:
    model, optimizer = wrapped(7, architecture, api, kind)  # another initialisation: the checkpoint replaces it
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(folder, "checkpoint"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ref = torch.load(os.path.join(folder, "ref.pt"))
    params, held = whole(model, optimizer)
    report = {"params": distance(params, ref["params"]), "state": distance(held, ref["state"]),
              "groups": groups(optimizer) == ref["groups"]}
    if dist.get_world_size() == 2:  # the save's ranks: the same steps, to the uninterrupted run's end
        train(model, optimizer, range(STEPS, STEPS + MORE))
        params, _ = whole(model, optimizer)
        report["final"] = distance(params, torch.load(os.path.join(folder, "final.pt")))
    close(model, optimizer, api)
    return report


def close(model, optimizer, api: str) -> None:
    if isinstance(model, gradsched.DistributedDataParallel):
        model.close()
    elif api == "wrap" and isinstance(optimizer, gradsched.ScheduledOptimizer):
        optimizer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["save", "load"])
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--architecture", default="sharded")
    parser.add_argument("--api", default="ddp", choices=["ddp", "wrap"])
    parser.add_argument("--model", default="rows", choices=["rows", "edges"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    report = (save if args.what == "save" else load)(args.folder, args.architecture, args.api, args.model)
    finish_with_every_report(args.out, report)


if __name__ == "__main__":
    main()
