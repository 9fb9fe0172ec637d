"""DDP's contract, scenario by scenario, on every rank: PyTorch's DDP first, then gradsched the
same way (``gradsched.DistributedDataParallel``, or ``gradsched.wrap`` with --api wrap).

    python -m workers.contract OUT --policy P [--api ddp|wrap]

Each scenario returns named tensors (gradients read right after ``backward()``, parameters
after training) and flags; rank r writes ``{scenario: {"ddp": ..., "ours": ...}}`` to
OUT.rank{r}.pt, and what each scenario raised, if anything, to OUT.rank{r}.json.
"""

from __future__ import annotations

import argparse
import io
import json
import time
import traceback
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gradsched.runtime import GradschedError
from workers.launch import finish


class TwoLayers(nn.Module):
    """Three layers, each used unless told otherwise, and one of zero features."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.empty = nn.Linear(4, 0)  # zero-size parameters: nothing to average

    def forward(self, x, use_b=True, use_c=True):
        y = self.a(x)
        if use_b:
            y = y + self.b(x)
        if use_c:
            y = y + self.c(x)
        return y.sum() + self.empty(x).sum()


def inputs(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + dist.get_rank())
    return torch.randn(8, 4, generator=g)


class Api:
    """The same steps, through PyTorch's DDP or one of gradsched's two ways in."""

    def __init__(self, kind: str, policy: str):
        self.kind, self.policy = kind, policy

    def wrap(self, model: nn.Module, optimizer=None, **options):
        """(what the script calls forward on, the optimizer to step or None, the closer)."""
        if self.kind == "torch":
            return TorchDDP(model, **options), optimizer, lambda: None
        extra = dict(policy=self.policy, timeout=60.0, profile_rounds=1, trial_rounds=3)  # plans change often
        if self.kind == "ddp":
            wrapped = gradsched.DistributedDataParallel(model, **options, **extra)
            return wrapped, optimizer, wrapped.close
        options.pop("init_sync", None)
        model, scheduled = gradsched.wrap(model, optimizer or torch.optim.SGD(model.parameters(), lr=0.0),
                                          extra.pop("policy"), broadcast_parameters=True, **options, **extra)
        return model, scheduled if optimizer is not None else None, scheduled.close


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n.removeprefix("module."): None if p.grad is None else p.grad.detach().clone()
            for n, p in model.named_parameters()}


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Through state_dict(), which applies gradsched's pending updates first."""
    return {n.removeprefix("module."): p.detach().clone() for n, p in model.state_dict().items()}


def unused_after_backward(api: Api) -> dict:
    """One backward pass with ``b`` unused everywhere and ``c`` used on rank 1 only; the
    gradients read at once (DDP: the averages; ``b.*`` stays None)."""
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers(), find_unused_parameters=True)
    model(inputs(0), use_b=False, use_c=dist.get_rank() == 1).backward()
    read = grads(model)
    model(inputs(1), use_c=False).backward()  # then a and b: accumulated onto the first
    second = grads(model)
    close()
    return {"first": read, "second": second}


def undefined_gradient(api: Api) -> dict:
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers(), find_unused_parameters=True)
    torch._C._functions.UndefinedGrad()(model(inputs(0))).backward()
    read = grads(model)
    close()
    return {"grads": read}


def create_graph(api: Api) -> dict:
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(3):
            model(inputs(step)).backward(create_graph=True)
    read = grads(model)
    close()
    return {"grads": read}


def manual_updates_in_join(api: Api) -> dict:
    """No optimizer: parameters updated by hand from the gradients; rank 1 trains 2 steps more
    inside join(divide_by_initial_world_size=False)."""
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers())
    steps = 3 + 2 * dist.get_rank()
    with model.join(divide_by_initial_world_size=False):
        for step in range(steps):
            model(inputs(step)).backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.1 * p.grad
                        p.grad = None
    result = params(model)
    close()
    return {"params": result}


def wrapped_again(api: Api) -> dict:
    """The same module wrapped twice (the first wrapper still alive), then trained: the
    second takes over."""
    torch.manual_seed(0)
    module = TwoLayers()
    first, _, close_first = api.wrap(module)
    first(inputs(0)).backward()
    second, _, close_second = api.wrap(module)
    for step in range(1, 4):
        second(inputs(step)).backward()
        with torch.no_grad():
            for p in second.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    result = params(second)
    close_second()
    close_first()
    return {"params": result}


def pickled(api: Api) -> dict:
    """Trained, saved whole with torch.save, loaded (every rank), trained on: DDP's wrapper
    pickles, and so must gradsched's."""
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built after the wrap, as DDP scripts do
    for step in range(2):
        model(inputs(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    optimizer = torch.optim.SGD(loaded.parameters(), lr=0.1)
    for step in range(2, 4):
        loaded(inputs(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    result = params(loaded)
    if api.kind != "torch":
        loaded.close()
    close()
    return {"params": result}


def never_reduced(api: Api) -> dict:
    """Without find_unused_parameters, ``b`` gets no gradient: reading a gradient that travels
    with it fails at once, saying why, instead of hanging (DDP raises at the next forward)."""
    torch.manual_seed(0)
    model, _, close = api.wrap(TwoLayers())
    model(inputs(0), use_b=False, use_c=False).backward()
    started = time.monotonic()
    try:
        torch.stack([p.grad.sum() for p in model.parameters() if p.grad is not None])
        raised = ""
    except GradschedError as exc:
        raised = str(exc)
    seconds = time.monotonic() - started
    try:
        close()
    except GradschedError:
        pass
    return {"raised": raised, "seconds": seconds}


SCENARIOS = {"unused_after_backward": unused_after_backward, "undefined_gradient": undefined_gradient,
             "create_graph": create_graph, "manual_updates_in_join": manual_updates_in_join,
             "wrapped_again": wrapped_again, "pickled": pickled}
OURS_ONLY = {"never_reduced": never_reduced}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--policy", default="bytescheduler")
    parser.add_argument("--api", choices=["ddp", "wrap"], default="ddp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results, errors = {}, {}
    scenarios = dict(SCENARIOS)
    if args.api == "wrap":  # join() and pickling belong to the wrapper (wrap's join: test_uneven_inputs.py)
        scenarios.pop("manual_updates_in_join")
        scenarios.pop("pickled")
    for name, scenario in {**scenarios, **OURS_ONLY}.items():
        try:
            ours = scenario(Api(args.api, args.policy))
            results[name] = {"ours": ours, "ddp": scenario(Api("torch", args.policy)) if name in SCENARIOS else None}
        except Exception:  # noqa: BLE001 - reported to the test
            errors[name] = traceback.format_exc()
    rank = dist.get_rank()
    torch.save(results, f"{args.out}.rank{rank}.pt")
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()
    finish()


if __name__ == "__main__":
    main()
