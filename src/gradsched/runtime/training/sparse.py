"""Parameters whose gradients are sparse (``nn.Embedding(sparse=True)``, ``nn.EmbeddingBag``).

A sparse gradient has no place in a flat message, so these parameters stay outside the plans:
each is all-reduced (a sum of sparse tensors, on gradsched's buffers group) as soon as its
gradient is accumulated in ``backward()``, and divided by the number of workers, as DDP reduces
it. Every rank's backward pass reaches them in the same order (the same graph), and the
training thread is inside ``backward()`` meanwhile, so nothing else issues on that group. The
user's optimizer steps them as any parameter gradsched does not schedule (SGD, SparseAdam...).
Their reduction waits on the wire inside ``backward()``: no overlap for them, the price of a
sparse tensor.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.errors import failing_rank


def sparse_parameters(model: nn.Module, ignored: set[str]) -> tuple[list[str], list[nn.Parameter]]:
    """The trainable parameters of ``model`` whose gradients are sparse: the weights of
    embeddings built with ``sparse=True`` (those in ``ignored`` left out)."""
    names, params, seen = [], [], set()
    for module_name, module in model.named_modules():
        if not (isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse):
            continue
        p = module.weight
        name = f"{module_name}.weight" if module_name else "weight"
        if p.requires_grad and id(p) not in seen and name not in ignored:
            seen.add(id(p))
            names.append(name)
            params.append(p)
    return names, params


def reduce_sparse(p: torch.Tensor, name: str, group: dist.ProcessGroup, workers: int,
                  scale: float | None, explain: Callable[[], str] | None) -> None:
    """Average ``p.grad`` over the workers of ``group`` (``scale``: join's correction)."""
    grad = p.grad
    if grad is None:
        return
    with torch.no_grad():
        total = grad.coalesce() if grad.is_sparse else grad.detach().clone()
        with failing_rank(f"reducing the sparse gradient of {name!r}", explain):
            dist.all_reduce(total, group=group)
        total = total / workers * (scale if scale is not None else 1.0)
    p.grad = total


def reduce_zeros(p: torch.Tensor, name: str, group: dist.ProcessGroup, explain: Callable[[], str] | None) -> None:
    """A joined rank's part in :func:`reduce_sparse`: an empty sparse gradient."""
    nothing = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),  # no rows
                                      torch.zeros((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape)
    with failing_rank(f"reducing the sparse gradient of {name!r} (join)", explain):
        dist.all_reduce(nothing, group=group)


class SparseGradients:
    """The sparse parameters of one wrap, reduced by the backend's gradient hook on each
    (:func:`reduce_sparse`), skipped where its backward pass accumulates locally."""

    def __init__(self, names: Sequence[str], params: Sequence[nn.Parameter], topology: Topology,
                 explain: Callable[[], str]) -> None:
        self.names, self.params = list(names), list(params)
        self.topology, self.explain = topology, explain  # (the group read when used: released at close)

    def attach(self, on_gradient: Callable[[str, torch.Tensor], None]) -> list:
        """``on_gradient(name, parameter)`` as each sparse gradient is accumulated; the hooks' handles."""
        return [p.register_post_accumulate_grad_hook(partial(on_gradient, name))
                for name, p in zip(self.names, self.params)]

    def reduce(self, name: str, p: torch.Tensor, scale: float | None) -> None:
        workers = self.topology.num_workers
        if workers > 1:
            reduce_sparse(p, name, self.topology.buffers, workers, scale, self.explain)

    def shadow(self) -> None:
        """A joined rank's part in every sparse reduction of one iteration."""
        for name, p in zip(self.names, self.params):
            reduce_zeros(p, name, self.topology.buffers, self.explain)
