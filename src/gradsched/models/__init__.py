"""Model tables: built-in model definitions profiled by FLOP count, or measured JSON profiles.

>>> model_table("resnet50", batch=32, device="v100").num_params
25557032

Importing this package does not import torch; building a built-in model does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from .devices import DEVICES, Device, get_device
from .table import Layer, ModelTable, ParamSpec


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    kind: str  # "image" (224x224, --classes applies) or "text" (--seq-len applies)
    default_seq_len: int = 0


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("vgg16", "VGG-16, 138.4M parameters at 1000 classes", "image"),
        ModelInfo("resnet50", "ResNet-50, 25.6M parameters at 1000 classes", "image"),
        ModelInfo("resnet152", "ResNet-152, 60.2M parameters at 1000 classes", "image"),
        ModelInfo("transformer", "Transformer base encoder-decoder, 63.1M parameters (shared 37k vocab)", "text", 128),
        ModelInfo("bert-large", "BERT-large encoder with pooler, 335.1M parameters", "text", 128),
    )
}


def _builder(name: str, num_classes: int) -> Callable:
    from . import cnn, transformer

    return {
        "vgg16": lambda: cnn.VGG16(num_classes),
        "resnet50": lambda: cnn.resnet50(num_classes),
        "resnet152": lambda: cnn.resnet152(num_classes),
        "transformer": transformer.TransformerBase,
        "bert-large": transformer.Bert,
    }[name]


def _inputs(name: str, batch: int, seq_len: int) -> Callable:
    import torch

    if MODELS[name].kind == "image":
        return lambda device: (torch.empty(batch, 3, 224, 224, device=device),)
    n_inputs = 2 if name == "transformer" else 1
    return lambda device: tuple(torch.zeros(batch, seq_len, dtype=torch.long, device=device) for _ in range(n_inputs))


@functools.lru_cache(maxsize=32)
def model_table(
    name: str, batch: int = 32, device: str = "v100", num_classes: int = 1000, seq_len: int | None = None
) -> ModelTable:
    """The table of built-in model ``name`` at ``batch`` samples per worker on ``device``.

    ``num_classes`` sets the classifier of image models (the papers also used 10000);
    ``seq_len`` the tokens per sample of text models.
    """
    info = MODELS.get(name)
    if info is None:
        raise ValueError(f"unknown model {name!r}; choose from: {', '.join(MODELS)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a whole number >= 1, got {batch!r}")
    if num_classes < 1:
        raise ValueError(f"classes must be >= 1, got {num_classes!r}")
    dev = get_device(device)
    seq_len = seq_len or info.default_seq_len
    if info.kind == "text" and seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    from .profiler import profile_model

    meta = {"batch": batch}
    if info.kind == "image":
        meta["num_classes"] = num_classes
    else:
        meta["seq_len"] = seq_len
    return profile_model(name, _builder(name, num_classes), _inputs(name, batch, seq_len), dev, meta)


__all__ = ["DEVICES", "Device", "Layer", "MODELS", "ModelInfo", "ModelTable", "ParamSpec", "get_device", "model_table"]
