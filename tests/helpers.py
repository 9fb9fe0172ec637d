"""Helpers shared by tests (import with ``from helpers import ...``)."""

from __future__ import annotations

import importlib.util
import random
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradsched.core import TensorSpec
from gradsched.models.table import Layer, ModelTable, ParamSpec


def random_tensors(rng: random.Random, count: int | None = None) -> list[TensorSpec]:
    count = count or rng.randint(3, 25)
    return [TensorSpec(f"t{i}", rng.randint(1, 6000), layer=i, priority=i) for i in range(count)]


def random_model(rng: random.Random, layers: int | None = None) -> ModelTable:
    """A random table: some layers without parameters, some with several tensors."""
    out = []
    n = layers or rng.randint(2, 12)
    for i in range(n):
        params = tuple(ParamSpec(f"l{i}.p{j}", rng.randint(1, 400_000)) for j in range(rng.choice([0, 1, 1, 2, 3])))
        out.append(Layer(f"l{i}", rng.uniform(0, 3e-3), rng.uniform(0, 6e-3), params))
    if not any(layer.params for layer in out):
        out[0] = Layer("l0", out[0].forward_s, out[0].backward_s, (ParamSpec("l0.p0", 1000),))
    return ModelTable("random", tuple(out))


ELASTIC_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_elastic.py"


def moved_by_elastic_example(final: dict) -> float:
    """How far ``final`` (parameters saved by examples/train_elastic.py) moved from the
    example's initial model: the largest element-wise change."""
    spec = importlib.util.spec_from_file_location("train_elastic", ELASTIC_EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return max(float((final[name] - p).abs().nan_to_num(float("inf")).max()) for name, p in example.make_model().state_dict().items())


class LiveTemporaries(TorchDispatchMode):
    """The most bytes held at once by tensors that operators made afresh while the mode was on
    (counted until the tensor object is collected: the optimizers' temporaries are not viewed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                nbytes = t.untyped_storage().nbytes()
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, nbytes)
        return out
