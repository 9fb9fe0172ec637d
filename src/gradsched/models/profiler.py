"""Build a :class:`ModelTable` from a model definition by counting FLOPs on meta tensors.

The model runs forward once on the ``meta`` device (no memory, no compute) with hooks that
record every leaf module call in execution order: its inputs and the bytes it reads and
writes. Each call is then replayed alone, forward and backward, under
:class:`torch.utils.flop_counter.FlopCounterMode`, with the same inputs requiring grad as
in the model, so backward FLOPs are exact per call (a first layer computes no input
gradient, for instance).

A *layer* of the table starts at each module that owns parameters (the first module to use
a tensor owns it); calls without parameters of their own (activations, pooling, attention
products, a reused tied projection) join the layer before them, so their time falls
between the right gradients in both directions. Each call costs, per pass,

    max(FLOPs / device.tflops, bytes / device.memory_gbs) + device.launch_s

with backward moving twice the forward bytes.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .devices import Device
from .table import Layer, ModelTable, ParamSpec


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    return []


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def call_flops(module: nn.Module, args: tuple) -> tuple[float, float]:
    """Forward and backward FLOPs of one call of ``module`` on meta ``args``."""
    fresh = []
    for a in args:
        if isinstance(a, torch.Tensor):
            leaf = torch.empty_like(a, device="meta").requires_grad_(a.requires_grad)
            fresh.append(leaf.clone() if a.requires_grad else leaf)  # clone: in-place modules
        else:
            fresh.append(a)
    forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward:
        out = module(*fresh)
    outs = [t for t in _tensors(out) if t.requires_grad]
    if outs:
        with backward:
            torch.autograd.backward(outs, [torch.empty_like(t) for t in outs])
    return float(forward.get_total_flops()), float(backward.get_total_flops())


def profile_model(
    name: str,
    build: Callable[[], nn.Module],
    make_inputs: Callable[[torch.device], Sequence[torch.Tensor]],
    device: Device,
    meta: dict | None = None,
) -> ModelTable:
    """Profile ``build()`` on ``make_inputs(meta_device)``; see the module docstring."""
    with torch.device("meta"):
        model = build()
    inputs = make_inputs(torch.device("meta"))
    names = {m: n for n, m in model.named_modules()}
    calls: list[tuple[nn.Module, tuple, int]] = []  # (module, inputs, bytes read + written)

    def hook(module: nn.Module, args: tuple, output) -> None:
        calls.append((module, args, _nbytes(args) + _nbytes(output)))

    handles = [m.register_forward_hook(hook) for m in names if not any(True for _ in m.children())]
    whole = FlopCounterMode(display=False)
    try:
        with whole:
            model(*inputs)
    finally:
        for h in handles:
            h.remove()

    peak = device.tflops * 1e12
    bandwidth = device.memory_gbs * 1e9
    owned: set[int] = set()
    layers: list[list] = []  # [name, forward_s, backward_s, params]
    counted = backward_flops = 0.0
    for module, args, io in calls:
        fqn = names[module]
        f_flops, b_flops = call_flops(module, args)
        counted += f_flops
        backward_flops += b_flops
        new_params = []
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in owned:
                owned.add(id(p))
                new_params.append(ParamSpec(f"{fqn}.{pname}", p.numel(), p.element_size()))
        io += sum(p.nbytes for p in new_params)
        fwd = max(f_flops / peak, io / bandwidth) + device.launch_s
        bwd = max(b_flops / peak, 2 * io / bandwidth) + device.launch_s
        if new_params or not layers:
            layers.append([fqn, 0.0, 0.0, new_params])
        layers[-1][1] += fwd
        layers[-1][2] += bwd
    missing = [n for n, p in model.named_parameters() if id(p) not in owned]
    if missing:
        raise ValueError(f"{name}: parameters never used in forward: {missing[:5]}")
    total = float(whole.get_total_flops())
    if total and abs(total - counted) > 0.01 * total:
        warnings.warn(
            f"{name}: {100 * (1 - counted / total):.1f}% of forward FLOPs happen outside leaf modules "
            "and are not in the table",
            stacklevel=2,
        )
    info = {
        "source": "flop-count",
        "device": device.name,
        "forward_flops": counted,
        "backward_flops": backward_flops,
        **(meta or {}),
    }
    return ModelTable(name, tuple(Layer(n, f, b, tuple(ps)) for n, f, b, ps in layers), info)
