"""Copying one rank's tensors to every rank (buffers before a forward pass; the whole model
at the end of ``join()``)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from gradsched.runtime.errors import failing_rank
from gradsched.runtime.torch_private import ddp_ignored


def flat_by_dtype(tensors: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """``tensors`` grouped by dtype in a fixed order (every rank the same), each group with its
    members copied together into one flat tensor."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    return [(by_dtype[d], torch.cat([t.detach().reshape(-1) for t in by_dtype[d]])) for d in sorted(by_dtype, key=str)]


def unflatten_into(members: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat``'s consecutive ranges back into ``members`` (what :func:`flat_by_dtype` joined)."""
    offset = 0
    with torch.no_grad():
        for t in members:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def broadcast_flat(tensors: Sequence[torch.Tensor], source: int, group: dist.ProcessGroup, what: str,
                   explain: Callable[[], str] | None = None) -> None:
    """Rank ``source``'s values of ``tensors`` into every rank's: one broadcast per dtype, of the
    tensors flattened together, in a fixed order (every rank must pass the same tensors)."""
    for members, flat in flat_by_dtype(tensors):
        with failing_rank(what, explain):
            dist.broadcast(flat, group_src=source, group=group)
        unflatten_into(members, flat)


def broadcast_model(model: torch.nn.Module, with_buffers: bool, source: int, group: dist.ProcessGroup,
                    explain: Callable[[], str] | None = None) -> None:
    """Copy rank ``source``'s parameters (and buffers, ``with_buffers``) to every rank (join's end)."""
    tensors = list(model.parameters()) + (buffers_of(model) if with_buffers else [])
    broadcast_flat(tensors, source, group, f"copying rank {source}'s parameters to every rank (join)", explain)


def buffers_of(model: torch.nn.Module) -> list[torch.Tensor]:
    """The module's buffers (BatchNorm statistics) that DDP syncs: those set to None and those
    DDP is told to ignore (``_set_params_and_buffers_to_ignore_for_model``) left out."""
    skip = ddp_ignored(model)
    return [b for name, b in model.named_buffers() if b is not None and name not in skip]
