"""How the exchange reduces one message of a plan: an all-reduce among the workers, or a push
to a parameter server and a pull of the sum back (:mod:`gradsched.runtime.ps`).

A transport gets the message's buffers (gradients already divided by the number of
workers) and returns futures that complete when the sum is available, together with the
tensors that will hold it (the buffers themselves for an all-reduce).

All-reduce uses the collectives' own futures: they complete in the order the backend
finishes them (two messages in flight may finish out of launch order, and a credit window
must learn of the first to finish at once), and on CUDA they order the update after the
reduction by stream. The callbacks then run on the backend's threads; every one has run
before ``close()`` returns. (Point-to-point operations have no futures on gloo: see
:class:`gradsched.runtime.ps.Waiter`.)
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
import torch.distributed as dist

from ..sim.plan import Plan


class Transport(Protocol):
    def announce(self, plan: Plan, version: int) -> None:
        """A plan agreed by the workers takes effect (called on every worker, in order)."""

    def begin_round(self, round_index: int, version: int) -> None:
        """This worker starts launching round ``round_index`` under plan ``version``."""

    def start(self, k: int, plan: Plan, buffers: Sequence[torch.Tensor]) -> tuple[list[torch.futures.Future], list[torch.Tensor]]:
        """Launch message ``k``; return completion futures and where each buffer's sum lands."""

    def close(self, wait: bool) -> None:
        """No message will follow; with ``wait``, tell peers so and wait for what is in flight."""


class AllReduce:
    """One async all-reduce per buffer on the workers' data group."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def announce(self, plan: Plan, version: int) -> None:
        pass

    def begin_round(self, round_index: int, version: int) -> None:
        pass

    def start(self, k: int, plan: Plan, buffers: Sequence[torch.Tensor]) -> tuple[list[torch.futures.Future], list[torch.Tensor]]:
        works = [dist.all_reduce(buffer, group=self.group, async_op=True) for buffer in buffers]
        return [w.get_future() for w in works], list(buffers)

    def close(self, wait: bool) -> None:
        pass
