"""DDP's buffer sync before a forward pass (BatchNorm statistics from one rank to every rank),
issued on the user's backend and waited for by the forward passes that read the buffers.

With all-reduce (and sharded) the broadcast travels on gradsched's ``broadcasts`` group, the
user's backend (NCCL on GPUs) on a communicator of its own: on the data group it would queue
behind every message of the round before (one NCCL stream runs one communicator's
collectives in order), and the first layer with buffers would wait for all of them. It is
issued by the launcher, the one thread that drives gradsched's communicators of the user's
backend, at a point of its order every rank shares: between the data group's messages of two
rounds (:meth:`gradsched.runtime.comm.exchange.Exchange.after_launched`).

Which point: the buffers a forward pass syncs are rank 0's as the forward pass before left
them, so they are copied and their broadcast queued as that forward pass *ends*
(:meth:`BufferSync.ahead`), before any message of its round: issued ahead of the backward pass,
it is long done when the next forward pass needs it. Issued as the next forward pass *begins*
instead, it would come after every message of the round before it, and under a credit window
the first BatchNorm would wait for the window to drain (issue 54: 938 of 1,296 ms a round,
benchmarks/buffer_broadcast.py). The next forward pass takes the copy only if rank 0's buffers
are still as copied (its tensors' versions and identities; rank 0 says so to every rank on the
control group, a one-byte broadcast on CPU); else it broadcasts them afresh, as before. Nothing
waits for the broadcast at the start of the forward pass: the forward pre-hook of each module
that owns buffers waits for it (on a GPU its stream waits, the host does not), and so do
``synchronize()``, checkpoints and the next broadcast. The root's own buffers are waited for
at once.

With parameter servers the data group holds the servers too, so buffers travel on the
workers' gloo group, at once (:func:`gradsched.runtime.comm.broadcast.broadcast_flat`).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradsched.runtime.comm.broadcast import broadcast_flat, buffers_of, flat_by_dtype, unflatten_into
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.device import Device, latest_per_stream
from gradsched.runtime import torch_private
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


def _issue_copies(copies: list[tuple[list[torch.Tensor], torch.Tensor]], group: dist.ProcessGroup, device: Device,
                  produced: list[Any]) -> list[tuple[Any, torch.Tensor]]:
    """On the launcher: rank 0's copies broadcast into every rank's, in place, after the training
    stream wrote them; the futures, each with its copy (kept by the waiter until it arrived)."""
    device.wait_for(latest_per_stream(produced))
    return [(device.issue(group, partial(dist.broadcast, flat, group_src=0, group=group, async_op=True)), flat)
            for _, flat in copies]


class Ahead(NamedTuple):
    """A broadcast of the buffers issued as a forward pass ended, for the next one to take."""

    tensors: list[torch.Tensor]  # the buffers copied, and their versions then
    versions: list[int]
    copies: list[tuple[list[torch.Tensor], torch.Tensor]]  # (buffers, their flat copy) per dtype
    issued: Callable[[], list[tuple[Any, torch.Tensor]]]  # the launcher's job: the broadcasts' futures

    def received(self) -> list[tuple[Any, torch.Tensor]]:
        """The broadcasts, each copied into the buffers once it arrived (on the waiting thread's stream)."""
        done = []
        for (future, flat), (members, _) in zip(self.issued(), self.copies):
            future.wait()
            unflatten_into(members, flat)
            done.append((future, flat))
        return done


class BufferSync:
    def __init__(self, model: nn.Module, exchange: Exchange, group: Callable[[], dist.ProcessGroup],
                 on_data_plane: bool, explain: Callable[[], str], device: Device,
                 control: Callable[[], dist.ProcessGroup] | None = None) -> None:
        """``group``: the group buffers travel on (the broadcasts group with ``on_data_plane``,
        else the workers' gloo group), asked for when they travel; ``device``: the gradients';
        ``control``: the workers' gloo group, where rank 0 says whether its buffers changed."""
        self.model = model
        self.control = control
        self._ahead: Ahead | None = None
        self.exchange = exchange
        self.device = device
        self.group = group
        self.on_data_plane = on_data_plane
        self.explain = explain
        synced = {id(t) for t in buffers_of(model)}
        self.owners = {m for m in model.modules() if any(id(b) in synced for b in m.buffers(recurse=False))}
        self._pending: Callable[[], list[tuple[torch.futures.Future, torch.Tensor]]] | None = None
        self.waited_s = 0.0  # seconds the training thread blocked waiting for broadcasts (benchmarks read it)
        self.taken_ahead = 0  # forward passes that took a broadcast issued ahead (tests read it)

    def ahead(self) -> None:
        """A forward pass ended and the next one syncs buffers (from rank 0): copy them now and
        queue their broadcast, ahead of this round's messages (see the module's docstring)."""
        self.drain()
        tensors = buffers_of(self.model)
        if not tensors or not self.on_data_plane:
            return
        copies = [(members, flat.clone()) for members, flat in flat_by_dtype(tensors)]
        produced = [self.device.produced(written=flat) for _, flat in copies]  # (the training stream's copies)
        self._ahead = Ahead(tensors, [torch_private.version(t) for t in tensors], copies,
                            self.exchange.after_launched(partial(_issue_copies, copies, self.group(), self.device,
                                                                 produced)))

    def start(self, source: int) -> None:
        """Copy rank ``source``'s buffers to every rank: under way once this returns."""
        self.wait()
        tensors = buffers_of(self.model)  # each time: a module may have replaced a buffer (as DDP reads them)
        if self._ahead is not None and source == 0 and self._agree_unchanged(tensors):
            self._pending, self._ahead = self._ahead.received, None
            self.taken_ahead += 1
        else:
            self.drain()
            self._start(tensors, source)
        if self._pending is not None and self.model in self.owners:  # the root's forward reads its own right away
            self.wait()

    def _agree_unchanged(self, tensors: list[torch.Tensor]) -> bool:
        """Whether rank 0's buffers are as copied ahead (rank 0 tells every rank: one byte on the control group)."""
        ahead = self._ahead
        same = len(tensors) == len(ahead.tensors) and all(
            a is b and torch_private.version(a) == v for a, b, v in zip(tensors, ahead.tensors, ahead.versions))
        flag = torch.tensor([int(same)], dtype=torch.uint8)
        with failing_rank(WHAT, self.explain):
            dist.broadcast(flag, group_src=0, group=self.control())
        return bool(flag.item())

    def drain(self) -> None:
        """A broadcast issued ahead that no forward pass takes: waited for, its values left aside."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with failing_rank(WHAT, self.explain):
                for future, _ in ahead.issued():
                    future.wait()

    def _start(self, tensors: list[torch.Tensor], source: int) -> None:
        if not tensors:
            return
        if not self.on_data_plane:
            broadcast_flat(tensors, source, self.group(), WHAT, self.explain)
            return
        issue = partial(broadcast_async, tensors, source, self.group(), self.device)
        self._pending = self.exchange.after_launched(issue)

    def before(self, module: nn.Module) -> None:
        """``module``'s forward pass is about to run: its buffers must have arrived."""
        if self._pending is not None and module in self.owners:
            self.wait()

    def wait(self) -> None:
        """Until the latest broadcast has arrived (on a GPU: the current stream waits for it)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        started = time.perf_counter()
        with failing_rank(WHAT, self.explain):
            for future, _ in pending():  # (the copy kept until then)
                future.wait()
        self.waited_s += time.perf_counter() - started

    def close(self) -> None:
        """Let go of the model and of what the coordinator gave (they refer back to it)."""
        self._pending = self._ahead = None
        self.model = self.exchange = self.group = self.explain = self.device = None
        self.owners = set()
