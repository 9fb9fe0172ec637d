"""The public torch.distributed calls whose name or options differ across the PyTorch versions
gradsched supports (``pyproject.toml``'s range), each chosen once, here, by what the installed
torch offers; the rest of the runtime calls these and never asks for a version.

- ``all_gather_single`` and ``reduce_scatter_single``: the names since 2.13; before, the same
  collectives were ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (kept, deprecated).
- ``new_group(..., sort_ranks=False)``: since 2.13; before, a group's ranks were always sorted,
  so a group whose order is not ascending cannot be made there (refused, with what to do).
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any, Sequence

import torch.distributed as dist

from gradsched.runtime.errors import GradschedError

#: torch's gather of equal parts into one tensor, and the reduce-scatter of one tensor, by either name
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

#: whether ``dist.new_group`` keeps the ranks in the order given
KEEPS_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters


def new_group(ranks: Sequence[int], backend: str | None, timeout: timedelta,
              local: bool = False) -> Any:
    """A process group of the global ``ranks`` whose group rank i is ``ranks[i]`` (``local``:
    only its members take part in making it)."""
    ranks = list(ranks)
    options: dict[str, Any] = {"use_local_synchronization": True} if local else {}
    if KEEPS_ORDER:
        options["sort_ranks"] = False
    elif ranks != sorted(ranks):
        raise GradschedError(f"a process group over ranks {ranks} in this order needs torch 2.13 or newer "
                             "(before, torch sorts a group's ranks): give gradsched a group whose ranks ascend")
    return dist.new_group(ranks, backend=backend, timeout=timeout, **options)
