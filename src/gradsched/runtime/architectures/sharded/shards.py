"""Sharded data parallelism on the data plane: every rank the owner of 1/n of every parameter.

Each parameter is cut by rows (its first dimension) as ``torch.chunk`` cuts it: ``k =
ceil(rows / n)`` rows a rank, rank ``r`` owning rows ``[r * k, (r + 1) * k)``, which flattened
are elements ``[r * c, (r + 1) * c)`` with ``c = k * row`` (those past the parameter's end are
padding). A 0-dimensional parameter is not cut: every rank holds it and its state whole (one
element), receives its average from the reduce-scatter (its gradient is every rank's part of
a message), and steps it alike, so nothing of it is gathered. Ownership is fixed for the whole
run, whatever the plans, so the optimizer state of a shard never moves between ranks. Being
rows, this rank's part of a parameter's averaged gradient is what
:class:`torch.distributed.tensor.DTensor` calls ``Shard(0)`` of it: ``.grad`` is that DTensor
once reduced (:meth:`Shards.grad_of`), so torch's own ``clip_grad_norm_`` and reads of
``.grad`` see the averaged gradient, as under DDP.

Plans are made over *shard coordinates*: the scheduler sees each parameter as ``c`` elements
of ``n`` times its element size (the bytes are the whole parameter's), so a slice
``(name, first, count)`` of a plan means elements ``[r * c + first, r * c + first + count)``
of rank ``r``'s shard for every ``r``, and every rank's part of every message has the same
size. A message then travels as one buffer per dtype in *rank-major* order (rank 0's parts of
its slices, then rank 1's, ...), which is what ``reduce_scatter_tensor`` and
``all_gather_into_tensor`` split and join:

* backward: :class:`ShardedLayout` packs the gradients of a message (a copy; a message of one
  whole parameter, unpadded, is its gradient's own memory), the
  :class:`ReduceScatter` transport divides it by ``n`` and reduce-scatters it in place, and
  this rank's part, the average of its shard, is copied into the shard's gradient buffer
  (:meth:`Shards.grad_buffer`, allocated for the round and handed to ``.grad`` once reduced:
  ``zero_grad(set_to_none=True)`` frees it, as it frees a gradient under FSDP2);
* after the step: :meth:`Shards.gather` packs this rank's updated shard of a message and
  all-gathers it; the result is copied back into the parameters. On gloo, uncompressed, no
  buffer is packed: each rank sends its part of every slice from the parameter's own memory
  and receives the others' parts straight into theirs (:meth:`Pairwise.exchange`), so the
  all-gathers, all issued at the step, hold no memory of their own and copy nothing.

With compression (``compression="bf16"``/``"fp16"``) both phases travel in the wire dtype: the
gradients as for an all-reduce (divided, cast, reduce-scattered, cast back), and the
parameters as the wire dtype's rounding of *master* shards. Each rank then keeps its shard
as a separate copy in the parameters' dtype, which its optimizer updates; every rank's
parameters, this rank's own part included, hold the rounding of the masters, so that all
ranks compute with the same values (what FSDP's ``MixedPrecisionPolicy(param_dtype=...)``
does, with the parameters kept in their own dtype). A parameter written by anyone else
since its last all-gather (``load_state_dict``, a ``copy_``) gives its master its new values
at the next step.
"""

from __future__ import annotations

import math
import threading
import weakref
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from gradsched.core.plan import PlannedMessage
from gradsched.core.task import TensorSpec
from gradsched.runtime import torch_api, torch_private
from gradsched.runtime.comm.compression import wire_dtype
from gradsched.runtime.comm.pairwise import Pairwise
from gradsched.runtime.comm.layout import Packed
from gradsched.runtime.comm.transport import BaseTransport, MessageKey, Reduced
from gradsched.runtime.device import Device
from gradsched.runtime.errors import GradschedError

Slice = tuple[str, int, int]  # (tensor, first element, number of elements), in shard coordinates


def _padded(flat: torch.Tensor, start: int, end: int, count: int) -> list[torch.Tensor]:
    """``flat[start:end]`` followed by zeros up to ``count`` elements (padding past a parameter's end)."""
    parts = [flat[start:end]] if end > start else []
    missing = count - max(0, end - start)
    if missing:
        parts.append(flat.new_zeros(missing))
    return parts


def _shard_elements(p: torch.Tensor, world: int) -> int:
    """``c``: whole rows of ``p``, as many as ``torch.chunk(p, world)`` gives its first chunk."""
    if p.dim() == 0 or p.shape[0] == 0:
        return max(1, math.ceil(p.numel() / world))
    return math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0])


class Shards:
    """This rank's shard of every parameter, what its optimizer updates (a view of the
    parameter's own memory; with compression its master copy), and a buffer for its averaged
    gradient."""

    def __init__(self, names: Sequence[str], params: Sequence[torch.Tensor], rank: int, world: int,
                 compression: str | None = None, separate: bool = False) -> None:
        """``separate``: each shard is memory of its own, not a view of its parameter (which
        fully sharded frees between uses); with compression it always is (the masters)."""
        self.names = list(names)
        self.params = list(params)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.rank, self.world = rank, world
        self.size = [_shard_elements(p, world) for p in self.params]  # c: shard elements, padding included
        self.start: list[int] = []  # where this rank's shard of each parameter begins in it (flattened)
        self.wire = wire_dtype(compression)  # what both phases travel as (None: the parameters' dtype)
        self.separate = separate or self.wire is not None  # shards apart from the parameters' memory
        self.tensors: list[torch.Tensor] = []  # this rank's shard of each parameter (may be empty)
        # the averaged gradient of each shard being reduced this round (c elements, the valid ones
        # first), held here from its first message until .grad takes it over (grad_of): None between
        self._reduced: list[torch.Tensor | None] = [None] * len(self.params)
        self._handed: list[Any] = [None] * len(self.params)  # a weak reference to the .grad grad_of made
        #: 0-dimensional parameters: replicated, not sharded (each rank holds the one element and its
        #: state, steps it with the average, and nothing of it is gathered; see _span)
        self.replicated = {i for i, p in enumerate(self.params) if p.dim() == 0}
        for i, (p, c) in enumerate(zip(self.params, self.size)):
            start = 0 if i in self.replicated else min(rank * c, p.numel())
            end = min(start + c, p.numel())
            self.start.append(start)
            view = p.detach().view(-1)[start:end]
            self.tensors.append(view.clone() if self.separate else view)
        self.of_param = {id(p): i for i, p in enumerate(self.params)}
        self.pairwise: Pairwise | None = None  # gloo: the phases as point-to-point operations (set by the plane)
        #: a packed buffer (its id) whose reduce-scatter writes this rank's result straight into
        #: the shard's gradient buffer (gloo, uncompressed, one slice per dtype): the view it
        #: writes, until the transport takes it (see ShardedLayout.pack)
        self.into: dict[int, torch.Tensor] = {}
        self.mesh: Any = None  # the DeviceMesh of the gradients' DTensors (its own group: see grad_of)
        self.device: Device | None = None  # where the gradients live (set by the plane): see grad_of
        self._lock = threading.Lock()  # gathers land on completion threads: a write and its record together
        self._written = [torch_private.version(p) for p in self.params]  # each parameter as the gathers left it

    def specs(self) -> list[TensorSpec]:
        """The scheduler's view: ``c`` elements of ``n`` times the parameter's element size each,
        in forward (parameter) order."""
        size = None if self.wire is None else torch.empty(0, dtype=self.wire).element_size()
        return [TensorSpec(name, c, layer=i, priority=i, element_size=self.world * (size or p.element_size()))
                for i, (name, p, c) in enumerate(zip(self.names, self.params, self.size))]

    def refresh(self) -> None:
        """With compression: the master shard of each parameter written since its last
        all-gather by anyone else is read again from it (without, the shards are the
        parameters' memory). Called by the training thread once every gather has landed."""
        if self.wire is None:
            return
        with self._lock:
            for i, p in enumerate(self.params):
                if torch_private.version(p) != self._written[i]:
                    shard = self.tensors[i]
                    shard.copy_(p.detach().view(-1)[self.start[i]:self.start[i] + shard.numel()])
                    self._written[i] = torch_private.version(p)

    def grad_of(self, i: int) -> torch.Tensor:
        """Parameter ``i``'s averaged gradient as torch sees a sharded one: a DTensor whose local
        part is this rank's shard of it (``Shard(0)``; a 0-dimensional parameter's ``Replicate``,
        the average on every rank), over this rank's gradient buffer. Collectives
        torch issues on it (a norm) run on the mesh's own group, never in the data plane's order."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        p, shard = self.params[i], self.tensors[i]
        with self._lock:
            buffer, self._reduced[i] = self._reduced[i], None
            if buffer is None:  # handed out already this round (or nothing reduced into it: zeros)
                handed = self._handed[i]() if self._handed[i] is not None else None
                if handed is not None:
                    return handed
                buffer = torch.zeros(self.size[i], dtype=p.dtype, device=p.device)
        if self.device is not None:  # made on the launcher's stream; freed by zero_grad() after the training
            self.device.used_here(buffer)  # stream's use (the optimizer's step): not reused before that ran
        if i in self.replicated:  # every rank holds the average
            local, placement = buffer[:1].view(()), Replicate()
        else:
            local = buffer[:shard.numel()].view(-1, *p.shape[1:])
            placement = Shard(0)
        grad = DTensor.from_local(local, self.mesh, [placement], shape=p.shape, stride=p.stride(), run_check=False)
        self._handed[i] = weakref.ref(grad)  # .grad holds it: zero_grad(set_to_none=True) frees it
        return grad

    def grad_buffer(self, i: int) -> torch.Tensor:
        """Where this round's averaged gradient of shard ``i`` goes: allocated at its first use
        (zeros), until :meth:`grad_of` hands it to ``.grad``."""
        with self._lock:
            buffer = self._reduced[i]
            if buffer is None:
                p = self.params[i]
                buffer = self._reduced[i] = torch.zeros(self.size[i], dtype=p.dtype, device=p.device)
            return buffer

    def param_of(self, i: int) -> torch.Tensor:
        """Parameter ``i``'s value as torch sees a sharded one (fully sharded's ``state_dict()``
        entry): a DTensor whose local part is this rank's shard (``Shard(0)``; a scalar's
        ``Replicate``), over the shard's own memory; ``full_tensor()`` (a collective) gives it whole."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        p = self.params[i]
        if i in self.replicated:  # a scalar: every rank's, whole
            return DTensor.from_local(self.tensors[i].detach().view(()), self.mesh, [Replicate()], shape=p.shape,
                                      stride=p.stride(), run_check=False)
        local = self.tensors[i].detach().view(-1, *p.shape[1:])
        return DTensor.from_local(local, self.mesh, [Shard(0)], shape=p.shape, stride=p.stride(), run_check=False)

    def load(self, i: int, value: torch.Tensor) -> None:
        """This rank's shard of parameter ``i`` from ``value``: the whole parameter, or a DTensor
        cut as :meth:`param_of`'s (its local part)."""
        from torch.distributed.tensor import DTensor

        p, shard = self.params[i], self.tensors[i]
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"size mismatch for {self.names[i]}: copying a param with shape {tuple(value.shape)}, "
                             f"the shape in the current model is {tuple(p.shape)}")
        if isinstance(value, DTensor):
            local = value.to_local().reshape(-1)
            if local.numel() != shard.numel():
                raise ValueError(f"{self.names[i]}: a DTensor cut otherwise than this model's shards "
                                 f"({local.numel()} elements here, {shard.numel()} expected)")
        else:
            local = value.detach().reshape(-1)[self.start[i]:self.start[i] + shard.numel()]
        with torch.no_grad():
            shard.copy_(local)

    def grad_views(self, slices: Sequence[Slice]) -> list[torch.Tensor]:
        return [self.grad_buffer(self.index[name])[first:first + count] for name, first, count in slices]

    def _span(self, i: int, r: int, first: int, count: int) -> tuple[int, int]:
        """Where elements ``[r * c + first, ... + count)`` of parameter ``i`` lie in it, flattened
        (what lies past its end is padding). A replicated scalar is every rank's part: each rank's
        slot of a reduce-scatter then carries the gradient, and each receives the average."""
        start = (0 if i in self.replicated else r * self.size[i]) + first
        return start, min(start + count, self.params[i].numel())

    def _part(self, flat: torch.Tensor, i: int, r: int, first: int, count: int) -> list[torch.Tensor]:
        """Elements ``[r * c + first, ... + count)`` of parameter ``i``'s flat ``flat``, padding as zeros."""
        return _padded(flat, *self._span(i, r, first, count), count)

    def pack(self, slices: Sequence[Slice], flats: Sequence[torch.Tensor]) -> torch.Tensor:
        """Rank-major: every rank's part of every slice of ``flats`` (one flat tensor per slice).
        One whole parameter that needs no padding is rank-major already: its flat tensor itself,
        no copy (the caller's to reduce in place)."""
        if len(slices) == 1:
            (name, first, count), flat = slices[0], flats[0]
            if first == 0 and count == self.size[self.index[name]] and flat.numel() == count * self.world:
                return flat
        parts = [part for r in range(self.world) for (name, first, count), flat in zip(slices, flats)
                 for part in self._part(flat, self.index[name], r, first, count)]
        return torch.cat(parts)

    def _own(self, i: int, first: int, count: int) -> list[torch.Tensor]:
        """Elements ``[first, first + count)`` of this rank's shard of parameter ``i``, padding as zeros."""
        shard = self.tensors[i]
        return _padded(shard, first, min(first + count, shard.numel()), count)

    def unpack(self, slices: Sequence[Slice], gathered: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's parts of ``slices`` (rank-major ``gathered``) into the parameters; this
        rank's own only where the shards are separate (else the step updated it there in place).
        The views it wrote: a future's value must hold them for its CUDA events to cover them."""
        total = sum(count for _, _, count in slices)
        written = []
        with torch.no_grad(), self._lock:
            for r in range(self.world):
                if r == self.rank and not self.separate:
                    continue
                position = r * total
                for name, first, count in slices:
                    i = self.index[name]
                    flat = self.params[i].view(-1)
                    start, end = self._span(i, r, first, count)
                    if i in self.replicated and r != self.rank:  # the same value, stepped here alike
                        end = start
                    if end > start:
                        written.append(flat[start:end].copy_(gathered[position:position + end - start]))
                        self._written[i] = torch_private.version(self.params[i])
                    position += count
        return written

    def _spans(self, slices: Sequence[Slice], r: int) -> list[torch.Tensor]:
        """Rank ``r``'s part of each of ``slices`` that holds elements, as views of the parameters."""
        views = []
        for name, first, count in slices:
            i = self.index[name]
            start, end = self._span(i, r, first, count)
            if end > start and i not in self.replicated:  # (a replicated scalar: stepped alike everywhere)
                views.append(self.params[i].detach().view(-1)[start:end])
        return views

    def gather(self, message: PlannedMessage, group: dist.ProcessGroup, device: Device) -> Gathered:
        """All-gather the parameters of ``message`` from their owners, issued through ``device``
        on the calling thread; done once they are back in the parameters (behind its events, on
        a device with streams: :meth:`Gathered.wait` before reading them)."""
        slices = message.slices
        if self.pairwise is not None and not self.separate:  # in place, no buffer
            mine = self._spans(slices, self.rank)
            theirs = {r: self._spans(slices, r) for r in range(self.world) if r != self.rank}
            return Gathered(device.issue(group, lambda: self.pairwise.exchange(mine, theirs)))
        mine = torch.cat([part for name, first, count in slices for part in self._own(self.index[name], first, count)])
        if self.wire is not None:
            mine = mine.to(self.wire)
        return self._gathered(slices, mine, self.pairwise, group, device)

    def _gathered(self, slices: Sequence[Slice], mine: torch.Tensor, pairwise: Pairwise | None,
                  group: dist.ProcessGroup, device: Device, keep_versions: bool = False) -> Gathered:
        """``mine`` (this rank's parts of ``slices``) all-gathered rank-major into a buffer and
        copied from there into the parameters by a callback of the collective's future."""
        total = mine.numel()
        gathered = mine.new_empty(total * self.world)
        if pairwise is not None:  # rank-major: rank r's part in slot r
            slot = [gathered[r * total:(r + 1) * total] for r in range(self.world)]
            slot[self.rank].copy_(mine)
            future = device.issue(group, lambda: pairwise.exchange(
                [mine], {r: [slot[r]] for r in range(self.world) if r != self.rank}))
        else:  # NCCL's all_gather_into_tensor (or its emulation's, on gloo)
            future = device.issue(group, lambda: torch_api.all_gather_single(gathered, mine, group=group,
                                                                             async_op=True))
        params = [self.params[self.index[name]] for name, _, _ in slices]
        versions = tuple(map(torch_private.version, params)) if keep_versions else None
        # the buffer is held by the record until the training thread waited (on NCCL a collective's
        # future completes once queued, so the callback may run long after this returns)
        return Gathered(future.then(partial(_unpacked, self, slices, gathered, versions)), gathered)

    def gather_whole(self, indices: Sequence[int], pairwise: Pairwise | None, group: dist.ProcessGroup,
                     device: Device) -> Gathered:
        """All-gather parameters ``indices`` whole into their own memory (allocated by the
        caller), issued through ``device`` on the calling thread. On gloo in place: this rank's
        shard is copied into its part, the others' parts are received straight into theirs; on
        NCCL (``pairwise`` None) into one buffer and copied out, as FSDP2 does. Autograd's version
        counters are left as they were (a forward pass may have saved the parameters; their
        values are the same ones again). Done once queued on NCCL (or its emulation): wait()
        before reading the parameters."""
        params = [self.params[i] for i in indices]
        slices = [(self.names[i], 0, self.size[i]) for i in indices]
        if pairwise is None:
            mine = torch.cat([part for i in indices for part in self._own(i, 0, self.size[i])])
            return self._gathered(slices, mine, None, group, device, keep_versions=True)
        versions = tuple(torch_private.version(p) for p in params)
        with torch.no_grad():
            for i in indices:
                shard = self.tensors[i]
                self.params[i].detach().view(-1)[self.start[i]:self.start[i] + shard.numel()].copy_(shard)
        torch_private.set_versions(params, versions)
        mine = self._spans(slices, self.rank)
        theirs = {r: self._spans(slices, r) for r in range(self.world) if r != self.rank}
        return Gathered(device.issue(group, lambda: pairwise.exchange(mine, theirs)))


def _unpacked(shards: Shards, slices: Sequence[Slice], gathered: torch.Tensor, versions: tuple | None,
              done: torch.futures.Future) -> list[torch.Tensor]:
    """A gather's callback: every rank's parts from the rank-major ``gathered`` into the
    parameters (their version counters set back to ``versions`` where given). Returns what it
    wrote and the buffer it read: on CUDA a future records its value's tensors as used by the
    callback's stream, which orders its waiters after the copies and keeps the buffer's memory
    from the next allocation until they ran (``record_stream``)."""
    done.value()  # raises if the collective failed
    written = shards.unpack(slices, gathered)
    if versions is not None:
        torch_private.set_versions([shards.params[shards.index[name]] for name, _, _ in slices], versions)
    return [*written, gathered]


class Gathered:
    """An all-gather of parameters: done (on the host) once its future completed; its
    parameters are in place behind the future's events (on a GPU: a stream that waited). It
    holds the buffer the gather went through until the training thread waited for it."""

    def __init__(self, future: Any, buffer: torch.Tensor | None = None) -> None:
        self.future = future
        self.buffer = buffer
        self.done = threading.Event()
        self.waited = False  # the training thread's stream is ordered after it
        future.add_done_callback(lambda _: self.done.set())

    def wait(self, timeout_s: float, what: str) -> None:
        """The training thread's stream after the gather (raises if it failed or timed out)."""
        if self.waited:
            return
        if not self.done.wait(timeout_s):
            raise GradschedError(f"timed out after {timeout_s:.0f} s waiting for the all-gather of {what}: another "
                                 "rank is stuck or did not step")
        self.future.wait()  # NCCL: complete once queued; this orders the stream after it
        self.waited = True
        self.buffer = None  # the callback's stream used it: on CUDA its future recorded that


def _coalesced(slices: Sequence[Slice], members: Sequence[int]) -> tuple[list[Slice], list[int]]:
    """``slices[k]`` for ``k`` in ``members``, each run of consecutive slices of one tensor
    joined into one (rank-major, a run's parts lie in the same order either way: a partitioned
    tensor's pieces in one message travel as one piece), and a member of each (its gradient)."""
    joined: list[list] = []  # [name, first, count, member]
    for k in members:
        name, first, count = slices[k]
        if joined and joined[-1][0] == name and joined[-1][1] + joined[-1][2] == first:
            joined[-1][2] += count
        else:
            joined.append([name, first, count, k])
    return [(name, first, count) for name, first, count, _ in joined], [k for *_, k in joined]


class ShardedLayout:
    """Where a message's gradients travel from under sharding: packed rank-major, per dtype (a
    copy; a message of one whole parameter that needs no padding travels in its gradient's own
    memory, which the exchange alone holds: ``.grad`` is a mark meanwhile); nothing is fused in
    place, gradients stay where autograd put them."""

    #: a message's gradients are read by its pack alone (its results go to the shards' buffers):
    #: on the host the launcher lets go of each once every message carrying it is packed
    reads_gradients_once = True

    def __init__(self, shards: Shards) -> None:
        self.shards = shards
        self.homes: dict[int, torch.Tensor] = {}  # none: each gradient stays in autograd's memory

    def pack(self, k: int, message: PlannedMessage, grads: Sequence[torch.Tensor],
             divide_by: int | None = None) -> Packed:
        """(buffers to reduce, where this rank's results are in them, where those go), per dtype;
        not divided (rank-major packing copies by pieces: the transport divides the buffers after)."""
        shards = self.shards
        by_dtype: dict[torch.dtype, list[int]] = {}
        for k, (name, _, _) in enumerate(message.slices):
            by_dtype.setdefault(grads[k].dtype, []).append(k)
        buffers, results, targets = [], [], []
        direct = shards.pairwise is not None and shards.wire is None  # where the transport reads shards.into
        for members in by_dtype.values():
            slices, members = _coalesced(message.slices, members)
            buffer = shards.pack(slices, [grads[k].view(-1) for k in members])
            total = buffer.numel() // shards.world
            buffers.append(buffer)
            results.append(buffer[shards.rank * total:(shards.rank + 1) * total])
            views = shards.grad_views(slices)
            if direct and len(views) == 1:  # received straight into its place: nothing to copy back
                shards.into[id(buffer)] = views[0]
                views = []
            targets.append(views)
        return Packed(buffers, results, targets, False)


class ReduceScatter(BaseTransport):
    """Each buffer (rank-major, see :class:`ShardedLayout`) divided by the ranks and
    reduce-scattered in place: this rank's part of it then holds the average of its shard."""

    def __init__(self, group: dist.ProcessGroup, pairwise: Pairwise | None,
                 into: dict[int, torch.Tensor] | None = None, before: Callable[[], None] | None = None) -> None:
        """``into``: where a buffer's result goes instead of its own part (``Shards.into``: gloo);
        ``before``: called before each message is sent (fully sharded: the gathers go first)."""
        self.before = before
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.pairwise = pairwise
        self.into = {} if into is None else into

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        for buffer in buffers:
            buffer.div_(self.size)

    def result_part(self, buffer: torch.Tensor) -> torch.Tensor:
        """Where in a reduced ``buffer`` this rank's result lies (all that compression casts back)."""
        total = buffer.numel() // self.size
        return buffer[self.rank * total:(self.rank + 1) * total]

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        if self.before is not None:
            self.before()
        if self.pairwise is not None:
            return [self.pairwise.reduce_scatter(buffer, self.into.pop(id(buffer), None)) for buffer in buffers]
        # works: the device takes their futures (NCCL's; on gloo, which gives this collective none,
        # only its emulation of NCCL comes here, and waits for the work itself)
        return [torch_api.reduce_scatter_single(self.result_part(buffer), buffer, group=self.group, async_op=True)
                for buffer in buffers]

    def close(self, wait: bool) -> None:
        if self.pairwise is not None:
            self.pairwise.close(wait)
        self.into.clear()  # buffers packed and never sent (a stopped round): their views go
        self.group = None
