"""Copying one rank's tensors to every rank (buffers before a forward pass; the whole model
at the end of ``join()``)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from gradsched.runtime.errors import failing_rank
from gradsched.runtime.torch_private import ddp_ignored


#: the most bytes one broadcast of :func:`broadcast_flat` copies tensors into (a tensor larger than
#: it travels alone, in its own memory): DDP's default bucket, so a model's broadcast at the end
#: of ``join()`` holds at most that beside the model, not a copy of it
CHUNK_BYTES = 25 << 20


def by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by dtype, in a fixed order (every rank the same)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return [groups[d] for d in sorted(groups, key=str)]


def flatten(members: Sequence[torch.Tensor]) -> torch.Tensor:
    """``members`` (of one dtype) copied together into one flat tensor."""
    return torch.cat([t.detach().reshape(-1) for t in members])


def flat_by_dtype(tensors: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """``tensors`` grouped by dtype in a fixed order (every rank the same), each group with its
    members copied together into one flat tensor."""
    return [(members, flatten(members)) for members in by_dtype(tensors)]


def unflatten_into(members: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat``'s consecutive ranges back into ``members`` (what :func:`flat_by_dtype` joined)."""
    offset = 0
    with torch.no_grad():
        for t in members:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def runs(members: Sequence[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``members`` cut, in order, into runs of at most ``limit`` bytes; a tensor larger than it
    is a run of its own."""
    cut: list[list[torch.Tensor]] = []
    held = 0
    for t in members:
        nbytes = t.numel() * t.element_size()
        if not cut or held + nbytes > limit:
            cut.append([])
            held = 0
        cut[-1].append(t)
        held += nbytes
    return cut


def broadcast_flat(tensors: Sequence[torch.Tensor], source: int, group: dist.ProcessGroup, what: str,
                   explain: Callable[[], str] | None = None) -> None:
    """Rank ``source``'s values of ``tensors`` into every rank's, in a fixed order (every rank
    must pass the same tensors): per dtype, runs of them of at most :data:`CHUNK_BYTES`
    flattened together into one broadcast each, and a contiguous tensor larger than that
    broadcast in place."""
    for members in by_dtype(tensors):
        for run in runs(members, CHUNK_BYTES):
            alone = len(run) == 1 and run[0].is_contiguous()
            flat = run[0].detach() if alone else flatten(run)
            with failing_rank(what, explain):
                dist.broadcast(flat, group_src=source, group=group)
            if not alone:
                unflatten_into(run, flat)


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
