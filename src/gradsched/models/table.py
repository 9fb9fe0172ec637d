"""The model table: what the simulator knows about a model.

Per layer, in forward order: its name, forward and backward compute time of one worker,
and the parameter tensors it owns (a tensor shared by several layers, such as tied
embeddings, belongs to the first layer that uses it in forward). Backward produces a
layer's gradients when that layer's backward ends.

Tables are built from model definitions (:mod:`gradsched.models.profiler`) or loaded from a
JSON profile; ``docs/profile-format.md`` documents the format. This module needs no torch.
"""

from __future__ import annotations

import dataclasses

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.task import TensorSpec

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int
    element_size: int = 4  # bytes per gradient element

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class Layer:
    name: str
    forward_s: float
    backward_s: float
    params: tuple[ParamSpec, ...] = ()


@dataclass(frozen=True)
class ModelTable:
    name: str
    layers: tuple[Layer, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)  # batch, device, source...

    def on_the_wire(self, element_size: int) -> ModelTable:
        """This table with every gradient travelling ``element_size`` bytes per element
        (compression: 2 for bf16/fp16); compute times unchanged."""
        layers = tuple(dataclasses.replace(layer, params=tuple(dataclasses.replace(p, element_size=element_size)
                                                               for p in layer.params)) for layer in self.layers)
        return dataclasses.replace(self, layers=layers, meta={**self.meta, "wire_element_size": element_size})

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no layers")
        if not any(layer.params for layer in self.layers):
            raise ValueError(f"model {self.name!r} has no parameters: nothing to communicate")
        seen: set[str] = set()
        for layer in self.layers:
            if not all(0 <= t < math.inf for t in (layer.forward_s, layer.backward_s)):  # NaN fails too
                raise ValueError(f"layer {layer.name!r}: compute times must be finite and >= 0, got "
                                 f"forward_s={layer.forward_s!r}, backward_s={layer.backward_s!r}")
            for p in layer.params:
                if p.name in seen:
                    raise ValueError(f"parameter {p.name!r} appears twice (a shared tensor belongs to one layer)")
                if p.numel < 1:
                    raise ValueError(f"parameter {p.name!r}: numel must be >= 1, got {p.numel}")
                seen.add(p.name)

    # -- derived figures ------------------------------------------------------------------
    def tensors(self) -> list[TensorSpec]:
        """Gradient tensors in forward order; priority = that position (0 = most urgent)."""
        out = []
        for index, layer in enumerate(self.layers):
            for p in layer.params:
                out.append(TensorSpec(p.name, p.numel, index, len(out), p.element_size))
        return out

    @property
    def compute_s(self) -> float:
        """Forward + backward time of one iteration on one worker."""
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def num_params(self) -> int:
        return sum(p.numel for layer in self.layers for p in layer.params)

    @property
    def gradient_bytes(self) -> int:
        return sum(p.nbytes for layer in self.layers for p in layer.params)

    # -- JSON ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "model": self.name,
            "meta": self.meta,
            "layers": [
                {
                    "name": layer.name,
                    "forward_s": layer.forward_s,
                    "backward_s": layer.backward_s,
                    "params": [
                        {"name": p.name, "numel": p.numel, "element_size": p.element_size} for p in layer.params
                    ],
                }
                for layer in self.layers
            ],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, data: Any, source: str = "profile") -> ModelTable:
        """Build a table from parsed JSON; errors name the offending field."""
        where = source

        def need(obj: Any, key: str, kind: type | tuple[type, ...], path: str) -> Any:
            if not isinstance(obj, dict) or key not in obj:
                raise ValueError(f"{where}: {path} is missing field {key!r}")
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                raise ValueError(f"{where}: {path}.{key} must be {names}, got {value!r}")
            return value

        if not isinstance(data, dict):
            raise ValueError(f"{where}: the top level must be a JSON object")
        version = data.get("format", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ValueError(f"{where}: format {version!r} is not supported (this version reads {FORMAT_VERSION})")
        name = need(data, "model", str, "profile")
        raw_layers = need(data, "layers", list, "profile")
        layers = []
        for i, raw in enumerate(raw_layers):
            path = f"layers[{i}]"
            params = []
            for j, p in enumerate(need(raw, "params", list, path)):
                ppath = f"{path}.params[{j}]"
                size = p.get("element_size", 4) if isinstance(p, dict) else 4
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise ValueError(f"{where}: {ppath}.element_size must be a positive integer, got {size!r}")
                params.append(ParamSpec(need(p, "name", str, ppath), need(p, "numel", int, ppath), size))
            fwd = float(need(raw, "forward_s", (int, float), path))
            bwd = float(need(raw, "backward_s", (int, float), path))
            layers.append(Layer(need(raw, "name", str, path), fwd, bwd, tuple(params)))
        meta = data.get("meta", {})
        try:
            return cls(name, tuple(layers), dict(meta) if isinstance(meta, dict) else {})
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> ModelTable:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read profile {str(path)!r}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"profile {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
        return cls.from_json(data, source=f"profile {str(path)!r}")
