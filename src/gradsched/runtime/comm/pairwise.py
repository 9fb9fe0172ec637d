"""Sharding's two phases on gloo as point-to-point operations (:mod:`gradsched.runtime.architectures.sharded.shards`).

gloo's own ``reduce_scatter_single`` and ``all_gather_single`` are slower than its
all-reduce of the same buffer, so there each rank sends every other rank its part and
receives its own from each, all at once.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from gradsched.runtime.comm.transport import Waiter
from gradsched.runtime.device import Device


class Pairwise:
    """Reduce-scatter and all-gather as point-to-point operations, for gloo: there each rank
    sends every other rank its part of a buffer and receives its own from each, the (n-1)/n
    of the buffer a ring moves, all at once, and one waiter completes the future. gloo's own
    collectives are slower than its all-reduce of the same buffer (50 MB, 2 ranks, loopback:
    all-reduce 45 ms, reduce_scatter_single 72 ms, all_gather_single 60 ms), which would make
    the two phases cost three all-reduces. Tags count the operations, which the launcher
    issues in the same order on every rank."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.waiter = Waiter()
        self._issued = 0

    def _tag(self, count: int = 1) -> int:
        """The first of ``count`` tags of their own (the same on every rank: the launcher
        issues in one order)."""
        first = self._issued + 1
        self._issued += count
        return first % (1 << 30)

    def reduce_scatter(self, buffer: torch.Tensor, into: torch.Tensor | None = None) -> torch.futures.Future:
        """This rank's part of ``buffer`` (n equal parts) summed over the ranks: its own first,
        then the others' in rank order (one fixed order: only this rank sums this part). In
        ``buffer``'s own part, or, given ``into`` (as large as a part), there: the first other
        rank's part is received straight into it and this rank's added (the same sum to the bit:
        the first addition commutes), which saves that receive buffer and the copy back."""
        n, r, tag = self.size, self.rank, self._tag()
        total = buffer.numel() // n
        parts = [buffer[j * total:(j + 1) * total] for j in range(n)]
        others = [j for j in range(n) if j != r]
        received: dict[int, torch.Tensor] = {}
        for j in others:  # the first other rank's part lands in ``into``, the rest in buffers of their own
            received[j] = into if into is not None and not received else buffer.new_empty(total)
        works = [dist.isend(parts[j], group_dst=j, group=self.group, tag=tag) for j in received]
        works += [dist.irecv(received[j], group_src=j, group=self.group, tag=tag) for j in received]

        def summed(done: torch.futures.Future) -> list[torch.Tensor]:
            done.value()  # raises if an operation failed
            if into is None:
                total, rest = parts[r], others
            else:  # the first other rank's part is in it already (alone: nothing)
                total, rest = (into.add_(parts[r]), others[1:]) if others else (into.copy_(parts[r]), [])
            for j in rest:
                total.add_(received[j])
            return [total]

        return self.waiter.track(works).then(summed)

    def exchange(self, mine: Sequence[torch.Tensor], theirs: dict[int, Sequence[torch.Tensor]]) -> torch.futures.Future:
        """An all-gather in place: ``mine`` (views of this rank's part) sent to every other rank,
        each rank ``j``'s parts received into ``theirs[j]`` (views where they belong), the k-th
        tensor of every rank's part on a tag of its own."""
        count = max([len(mine), *map(len, theirs.values())])
        base = self._tag(max(count, 1))
        works = [dist.isend(t, group_dst=j, group=self.group, tag=(base + k) % (1 << 30))
                 for j in theirs for k, t in enumerate(mine)]
        works += [dist.irecv(t, group_src=j, group=self.group, tag=(base + k) % (1 << 30))
                  for j, parts in theirs.items() for k, t in enumerate(parts)]
        return self.waiter.track(works)

    def close(self, wait: bool) -> None:
        self.waiter.stop(5.0 if wait else 0.5)


def pairwise_for(group: dist.ProcessGroup, device: Device) -> Pairwise | None:
    """The point-to-point phases where the backend is gloo on the host; None: the backend's own
    collectives (NCCL, and its emulation on CPU, which must take NCCL's path to check it)."""
    return Pairwise(group) if device.point_to_point and dist.get_backend(group) == "gloo" else None
