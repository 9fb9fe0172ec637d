"""Where the gradients live under one plan: flat buffers that fused messages reduce in place.

Each plan gets one flat buffer per dtype and device. Every gradient is a contiguous view of
it (its *home*), gradients in the order the plan first sends them. A message whose slices
are consecutive in that order is a view of the buffer too and is reduced in place: no copy
in at launch, no copy back. Others (a block that skipped ahead to fill its budget, mixed
dtypes) are copied into a temporary buffer and back.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Sequence

import torch

from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.broadcast import flat_by_dtype
from gradsched.runtime.comm.plans import Adopted, PlanVersions

BufferKey = tuple[torch.dtype, torch.device]


class BufferLayout:
    def __init__(self, plan: Plan, index: Mapping[str, int], like: Sequence[torch.Tensor]) -> None:
        """``index``: tensor name -> position in ``like``; ``like``: the parameters (shape,
        dtype and device of each gradient)."""
        self.plan = plan
        order: list[int] = []
        for message in plan.messages:
            for name in message.tensors:
                if index[name] not in order:
                    order.append(index[name])
        sizes: dict[BufferKey, int] = {}
        place: dict[int, tuple[BufferKey, int]] = {}  # tensor -> (buffer key, first element)
        for i in order:
            key = (like[i].dtype, like[i].device)
            place[i] = (key, sizes.get(key, 0))
            sizes[key] = sizes.get(key, 0) + like[i].numel()
        flat = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in sizes.items()}
        self.homes: dict[int, torch.Tensor] = {
            i: flat[key][start : start + like[i].numel()].view_as(like[i]) for i, (key, start) in place.items()
        }
        self.fused: dict[int, torch.Tensor] = {}  # message -> its range of a flat buffer
        for k, message in enumerate(plan.messages):
            ranges = [(place[index[name]][0], place[index[name]][1] + offset, numel)
                      for name, offset, numel in message.slices]
            key = ranges[0][0]
            consecutive = all(a[1] + a[2] == b[1] for a, b in zip(ranges, ranges[1:]))
            if consecutive and all(r[0] == key for r in ranges):
                self.fused[k] = flat[key][ranges[0][1] : ranges[-1][1] + ranges[-1][2]]

    def pack(self, k: int, message: PlannedMessage, grads: Sequence[torch.Tensor]) -> tuple[list, list | None, list | None]:
        """Message ``k``'s buffers (``grads``: the gradients of its slices, in order): (the
        buffers to reduce, where their results are, the views those go back to; both None
        where the buffers are the gradients' own memory)."""
        fused = self.fused.get(k)
        if fused is not None:  # the gradients already live, in order, in the message's range
            return [fused], None, None
        views = [g.view(-1)[offset : offset + numel] for g, (_, offset, numel) in zip(grads, message.slices)]
        if len(views) == 1:
            return views, None, None
        grouped = flat_by_dtype(views)  # copied into one buffer per dtype: one operation each, in a fixed order
        buffers = [flat for _, flat in grouped]
        return buffers, buffers, [members for members, _ in grouped]


class Layouts:
    """The layout of every plan a round may still follow, made when first asked for (by the
    training thread, for homes, or by the launcher) and dropped with the plan."""

    def __init__(self, index: Mapping[str, int], like: Sequence[torch.Tensor], versions: PlanVersions,
                 make: Callable[[Plan], Any] | None = None) -> None:
        self.index = index
        self.like = like
        self.versions = versions  # read under the exchange's lock, which callers hold
        self.make = make or (lambda plan: BufferLayout(plan, index, like))  # a plan's layout (sharded: its own)
        self._lock = threading.Lock()
        self._made: dict[int, BufferLayout] = {}  # plan version -> layout

    def of(self, adopted: Adopted) -> BufferLayout:
        with self._lock:
            # the layouts of plans no round follows any more go at once (each holds a flat
            # buffer as large as the gradients), not when the next plan's is made
            self._made = {v: l for v, l in self._made.items() if v in self.versions}
            layout = self._made.get(adopted.version)
            if layout is None:
                layout = self._made[adopted.version] = self.make(adopted.plan)
            return layout

    def clear(self) -> None:
        with self._lock:
            self._made.clear()
