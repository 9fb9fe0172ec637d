"""Copying one rank's tensors to every rank (buffers before a forward pass; the whole model
at the end of ``join()``)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .errors import failing_rank


def broadcast_flat(tensors: Sequence[torch.Tensor], source: int, group: dist.ProcessGroup, what: str,
                   explain: Callable[[], str] | None = None) -> None:
    """Rank ``source``'s values of ``tensors`` into every rank's: one broadcast per dtype, of the
    tensors flattened together, in a fixed order (every rank must pass the same tensors)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype in sorted(by_dtype, key=str):
        members = by_dtype[dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in members])
        with failing_rank(what, explain):
            dist.broadcast(flat, src=source, group=group)
        offset = 0
        with torch.no_grad():
            for t in members:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def buffers_of(model: torch.nn.Module) -> list[torch.Tensor]:
    """The module's buffers (BatchNorm statistics), those set to None left out."""
    return [b for b in model.buffers() if b is not None]
