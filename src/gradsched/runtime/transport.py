"""The transport seam: how one message's buffers are averaged over the workers.

A transport is told *which* message it reduces (a :class:`MessageKey`: the round, the
version of the plan the round follows, the message's index in it) and gets the message's
buffers, one per dtype, holding this rank's gradients. It returns a future that completes
when the averages are available, with the tensors that hold them (the buffers themselves,
for an in-place all-reduce). A transport that sends before it completes (a push to
parameter servers, then a pull) also calls ``on_sent`` once this rank's part is sent;
others never do, and the message counts as sent when it completes. Dividing by the number of workers is the transport's job, as
in DDP's communication hooks, so that a transport that changes what travels (compression,
say) decides where the division happens.

:class:`AllReduce` is the default. Parameter servers have their own
(:class:`gradsched.runtime.ps.PushPull`); the round headers servers need live in it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol, Sequence

import torch
import torch.distributed as dist

from .compression import WireBuffers

Reduced = torch.futures.Future  # of list[torch.Tensor]: the averages, one per buffer


class MessageKey(NamedTuple):
    round: int  # the backward pass, numbered from 1
    version: int  # of the plan the round follows (see gradsched.runtime.plans)
    index: int  # of the message in that plan


class Transport(Protocol):
    def reduce(self, key: MessageKey, buffers: Sequence[torch.Tensor],
               on_sent: Callable[[], None] | None = None) -> Reduced:
        """Start averaging ``buffers`` over the workers. Messages arrive in plan order,
        rounds in order, on one thread."""

    def close(self, wait: bool) -> None:
        """No message will follow; with ``wait``, tell peers so and wait for what is in flight."""


def check_results(future: torch.futures.Future, results: list[torch.Tensor]) -> list[torch.Tensor]:
    """The value of a future over several operations' futures: ``results``, or the first
    failure raised."""
    for inner in future.value():
        inner.value()
    return results


class AllReduce:
    """One async all-reduce per buffer on the workers' data group.

    It uses the collectives' own futures: they complete in the order the backend finishes
    them (two messages in flight may finish out of launch order, and a credit window must
    learn of the first to finish at once), and on CUDA they order the update after the
    reduction by stream."""

    def __init__(self, group: dist.ProcessGroup, wire: torch.dtype | None = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.wire = WireBuffers(wire)  # compression (gradsched.runtime.compression): what messages travel as

    def reduce(self, key: MessageKey, buffers: Sequence[torch.Tensor],
               on_sent: Callable[[], None] | None = None) -> Reduced:
        results = list(buffers)
        for buffer in results:
            buffer.div_(self.size)
        sent = self.wire.cast(key.version, key.index, results)
        works = [dist.all_reduce(buffer, group=self.group, async_op=True) for buffer in sent]

        def arrived(future: torch.futures.Future) -> list[torch.Tensor]:
            check_results(future, results)
            for buffer, wire in zip(results, sent):
                if wire is not buffer:
                    buffer.copy_(wire)
            return results

        return torch.futures.collect_all([w.get_future() for w in works]).then(arrived)

    def close(self, wait: bool) -> None:
        self.group = None
