"""``find_unused_parameters``: which parameters a backward pass leaves without a gradient.

DDP's contract, which gradsched keeps: once ``backward()`` returns, every parameter's
``.grad`` reads as the average over the ranks, whether this rank used it or not:

* *used* means a defined gradient since the latest backward pass that communicated (the
  passes under ``no_sync()`` count too);
* a parameter used on some rank only is reduced with what the others hold: their ``.grad``
  if they have one (accumulated under ``no_sync()``, or left from before), else zeros;
* a parameter used on no rank is left as it is (``None`` stays ``None``).

Which parameters the running backward pass will reach is known at its first gradient: the
autograd engine has built the pass's graph by then, and a parameter's gradient accumulator
either is in it or is not. Its gradient hook then reports each parameter as backward reaches
it (with a defined gradient, or an undefined one); after the last one the pass is over as far
as this model goes, and :class:`UnusedParameters` says so. The ranks then agree on what was
used with one small all-reduce (the coordinator's), the same one DDP makes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.autograd.graph import get_gradient_edge

from gradsched.runtime.errors import failing_rank
from gradsched.runtime.torch_private import will_be_reached


def _reached(node: object) -> bool:
    """Whether the backward pass running on this thread executes ``node``.

    The engine's own answer, the one :func:`torch.autograd.graph.register_multi_grad_hook` is
    built on. That hook itself cannot be used on parameters: it makes ``torch.autograd.grad``
    with parameters as inputs raise.
    """
    return will_be_reached(node)


class UnusedParameters:
    """Tracks, per backward pass that communicates, the parameters it reached and which of
    them got a defined gradient."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        # The accumulators the forward passes' graphs hold: kept, so that every graph uses these
        self._nodes = [get_gradient_edge(p).node for p in params]
        self.used: set[int] = set()  # a defined gradient since the latest pass that communicated
        self._waiting: set[int] | None = None  # reached by the running pass, not reported yet

    def local_gradient(self, i: int) -> None:
        """Parameter ``i`` got a defined gradient in a pass that does not communicate."""
        self.used.add(i)

    def begin(self) -> None:
        """The first gradient of a pass that communicates: which parameters will it reach?"""
        self._waiting = {i for i, node in enumerate(self._nodes) if _reached(node)}

    @property
    def open(self) -> bool:
        """A pass began and was not settled yet."""
        return self._waiting is not None

    def report(self, i: int, defined: bool) -> bool:
        """Backward reached parameter ``i``; True once every parameter it will reach has been."""
        if defined:
            self.used.add(i)
        if self._waiting is None:
            return False
        self._waiting.discard(i)
        return not self._waiting

    def settle(self, count: int) -> list[int]:
        """The pass is over: the parameters (of ``count``) with no defined gradient since the
        latest pass that communicated. Starts the next window."""
        unused = [i for i in range(count) if i not in self.used]
        self.used.clear()
        self._waiting = None
        return unused

    def close(self) -> None:
        self._nodes = []


def agree_unused(missing: Sequence[int], count: int, group: dist.ProcessGroup | None,
                 explain: Callable[[], str] | None = None) -> set[int]:
    """The parameters of ``missing`` (of ``count``, this rank's unused ones) that no rank used:
    one all-reduce on ``group`` (None: this rank alone)."""
    flags = torch.zeros(count, dtype=torch.float64)
    flags[list(missing)] = 1.0
    if group is not None:
        with failing_rank("agreeing on unused parameters", explain):
            dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
    return {i for i in missing if flags[i].item() == 1.0}
