"""DDP's buffer sync before a forward pass (BatchNorm statistics from one rank to every rank),
issued on the user's backend and waited for by the forward passes that read the buffers.

With all-reduce (and sharded) the broadcast travels on gradsched's ``broadcasts`` group, the
user's backend (NCCL on GPUs) on a communicator of its own: on the data group it would queue
behind every message of the round before (one NCCL stream runs one communicator's
collectives in order), and the first layer with buffers would wait for all of them. It is
issued by the launcher, the one thread that drives gradsched's communicators of the user's
backend, at the point of its order every rank shares: after every message of the rounds
begun so far, before the next round's first
(:meth:`gradsched.runtime.comm.exchange.Exchange.after_launched`; the job waits for what the
training thread queued before, the previous forward pass's statistics). Nothing waits for it
at the start of the forward pass: the forward pre-hook of each module that owns buffers waits
for the broadcast (on a GPU its stream waits, the host does not), and so do
``synchronize()``, checkpoints and the next broadcast. The root's own buffers are waited for
at once.

With parameter servers the data group holds the servers too, so buffers travel on the
workers' gloo group, at once (:func:`gradsched.runtime.comm.broadcast.broadcast_flat`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradsched.runtime.comm.broadcast import broadcast_flat, buffers_of, flat_by_dtype, unflatten_into
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.device import Device
from gradsched.runtime.errors import failing_rank

WHAT = "broadcasting buffers"


def _copy_back(members: Sequence[torch.Tensor], flat: torch.Tensor, future: torch.futures.Future) -> torch.Tensor:
    future.value()  # raises if the broadcast failed
    unflatten_into(members, flat)
    return flat


def broadcast_async(tensors: Sequence[torch.Tensor], source: int, group: dist.ProcessGroup,
                    device: Device) -> list[tuple[Any, torch.Tensor]]:
    """On the launcher: rank ``source``'s values of ``tensors`` into every rank's, one broadcast
    per dtype (as :func:`~gradsched.runtime.comm.broadcast.broadcast_flat`), without waiting; the
    futures complete once copied back (behind their events, on a device with streams), each with
    the flat copy it travelled in, which its waiter keeps until then (on CUDA memory let go of
    while a stream still uses it goes to the next allocation)."""
    futures = []
    for members, flat in flat_by_dtype(tensors):
        started = device.issue(group, partial(dist.broadcast, flat, group_src=source, group=group, async_op=True))
        futures.append((started.then(partial(_copy_back, members, flat)), flat))
    return futures


class BufferSync:
    def __init__(self, model: nn.Module, exchange: Exchange, group: Callable[[], dist.ProcessGroup],
                 on_data_plane: bool, explain: Callable[[], str], device: Device) -> None:
        """``group``: the group buffers travel on (the broadcasts group with ``on_data_plane``,
        else the workers' gloo group), asked for when they travel; ``device``: the gradients'."""
        self.model = model
        self.exchange = exchange
        self.device = device
        self.group = group
        self.on_data_plane = on_data_plane
        self.explain = explain
        synced = {id(t) for t in buffers_of(model)}
        self.owners = {m for m in model.modules() if any(id(b) in synced for b in m.buffers(recurse=False))}
        self._pending: Callable[[], list[tuple[torch.futures.Future, torch.Tensor]]] | None = None

    def start(self, source: int) -> None:
        """Copy rank ``source``'s buffers to every rank: under way once this returns."""
        self.wait()
        tensors = buffers_of(self.model)  # each time: a module may have replaced a buffer (as DDP reads them)
        if not tensors:
            return
        if not self.on_data_plane:
            broadcast_flat(tensors, source, self.group(), WHAT, self.explain)
            return
        issue = partial(broadcast_async, tensors, source, self.group(), self.device)
        self._pending = self.exchange.after_launched(issue)
        if self.model in self.owners:  # the root's forward reads its own right away
            self.wait()

    def before(self, module: nn.Module) -> None:
        """``module``'s forward pass is about to run: its buffers must have arrived."""
        if self._pending is not None and module in self.owners:
            self.wait()

    def wait(self) -> None:
        """Until the latest broadcast has arrived (on a GPU: the current stream waits for it)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with failing_rank(WHAT, self.explain):
            for future, _ in pending():  # (the copy kept until then)
                future.wait()

    def close(self) -> None:
        """Let go of the model and of what the coordinator gave (they refer back to it)."""
        self._pending = None
        self.model = self.exchange = self.group = self.explain = self.device = None
        self.owners = set()
