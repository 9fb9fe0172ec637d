"""Where the gradients live: one flat buffer per dtype and device for the whole run, which
the messages of every plan reduce in place where they can.

Every gradient has a fixed *home* in it, a contiguous view, the gradients in the order of
DDP's buckets (the measured trial's other arm, and what the hand-off gives DDP's reducer: the
order the backward pass gives them, near enough), whatever plans follow: one gradient buffer
is alive at a time, also while two plans are in use (a re-plan, the measured trial's two
arms), as DDP's buckets with ``gradient_as_bucket_view``; and every bucket is a range of it.
The buffer is cut, between the buckets, into chunks of at least DDP's bucket size, each its
own allocation, so that the hand-off to DDP's reducer can move the gradients out chunk by chunk
and never hold two copies of them.
A message whose slices tile one range of the buffer, in whatever order, is a view of it and
is reduced in place: no copy in at launch, no copy back. Others (a block that skipped ahead
to fill its budget, a plan that groups gradients the first one kept apart, mixed dtypes) are
copied into a temporary buffer and back: memory held only while the message is in flight.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch

from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.broadcast import by_dtype, flatten
from gradsched.runtime.comm.plans import Adopted, PlanVersions

BufferKey = tuple[torch.dtype, torch.device, int]  # dtype, device, chunk


class GradientHomes:
    """The flat buffers and every gradient's place in them, laid out once (in ``plan``'s order)."""

    def __init__(self, plan: Plan, index: Mapping[str, int], like: Sequence[torch.Tensor],
                 chunk_bytes: int | None = None) -> None:
        """``index``: tensor name -> position in ``like``; ``like``: the parameters (shape,
        dtype and device of each gradient); a chunk closes once it holds ``chunk_bytes`` or more,
        between two tensors no message of ``plan`` holds both of, so that its messages stay
        ranges of one chunk (None: one chunk per dtype and device)."""
        order: list[int] = []
        for message in plan.messages:
            for name in message.tensors:
                if index[name] not in order:
                    order.append(index[name])
        together = {(index[a], index[b]) for m in plan.messages for a in m.tensors for b in m.tensors}
        sizes: dict[BufferKey, int] = {}
        open_chunk: dict[tuple[torch.dtype, torch.device], int] = {}
        last: dict[tuple[torch.dtype, torch.device], int] = {}  # the tensor placed last in each kind's chunk
        self.place: dict[int, tuple[BufferKey, int]] = {}  # tensor -> (buffer key, first element)
        for i in order:
            kind = (like[i].dtype, like[i].device)
            chunk = open_chunk.setdefault(kind, 0)
            used = sizes.get((*kind, chunk), 0)
            # a full chunk closes between two tensors no message of the plan holds both of
            if chunk_bytes is not None and used * like[i].element_size() >= chunk_bytes \
                    and (last[kind], i) not in together:
                chunk = open_chunk[kind] = chunk + 1
                used = 0
            key = (*kind, chunk)
            self.place[i] = (key, used)
            sizes[key] = used + like[i].numel()
            last[kind] = i
        self.flat = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in sizes.items()}
        self.of: dict[int, torch.Tensor] = {
            i: self.flat[key][start : start + like[i].numel()].view_as(like[i])
            for i, (key, start) in self.place.items()}


class BufferLayout:
    """A plan over the gradients' homes: which of its messages are a range of a flat buffer."""

    #: a message's results go back into the gradients it was made of: they stay until it ends
    reads_gradients_once = False

    def __init__(self, plan: Plan, index: Mapping[str, int], homes: GradientHomes) -> None:
        self.plan = plan
        self.homes = homes.of
        place = homes.place
        self.fused: dict[int, torch.Tensor] = {}  # message -> its range of a flat buffer
        for k, message in enumerate(plan.messages):
            # in any order: a reduction is elementwise, and every rank lays the homes out alike, so
            # a message whose slices tile one range (a block in priority order over homes in
            # backward order) reduces that range in place
            ranges = sorted(((place[index[name]][0], place[index[name]][1] + offset, numel)
                             for name, offset, numel in message.slices), key=lambda r: r[1])
            key = ranges[0][0]
            consecutive = all(a[1] + a[2] == b[1] for a, b in zip(ranges, ranges[1:]))
            if consecutive and all(r[0] == key for r in ranges):
                self.fused[k] = homes.flat[key][ranges[0][1] : ranges[-1][1] + ranges[-1][2]]

    def pack(self, k: int, message: PlannedMessage, grads: Sequence[torch.Tensor],
             divide_by: int | None = None) -> Packed:
        """Message ``k``'s buffers (``grads``: the gradients of its slices, in order): the
        buffers to reduce, where their results are and the views those go back to (both None
        where the buffers are the gradients' own memory), and whether the buffers are divided
        by ``divide_by`` already (a copy made divided: one pass over the bytes, not two)."""
        fused = self.fused.get(k)
        if fused is not None:  # the gradients already live, in order, in the message's range
            return Packed([fused], None, None, False)
        views = [g.view(-1)[offset : offset + numel] for g, (_, offset, numel) in zip(grads, message.slices)]
        if len(views) == 1:
            return Packed(views, None, None, False)
        groups = by_dtype(views)  # copied into one buffer per dtype, in a fixed order
        if divide_by is None:
            buffers = [flatten(members) for members in groups]
        else:
            buffers = [_divided_copy(members, divide_by) for members in groups]
        return Packed(buffers, buffers, groups, divide_by is not None)


class Packed(NamedTuple):
    """A message's buffers as :meth:`BufferLayout.pack` (and an architecture's own layout) gives them."""

    buffers: list  # to reduce
    results: list | None  # where their results are (None: the buffers are the gradients' own memory)
    targets: list | None  # the views each result goes back to
    divided: bool  # already divided as the transport would before they travel


#: a member of a copied message at least this large is divided as it is copied (one operation, one pass
#: over it); smaller ones are copied together and then divided (two operations in all, two passes)
DIVIDED_COPY_BYTES = 64 << 10


def _divided_copy(members: Sequence[torch.Tensor], divisor: int) -> torch.Tensor:
    """``members`` (of one dtype) copied together into one flat tensor, each element divided by
    ``divisor``: the same values, bit for bit, as a copy divided in place afterwards."""
    if sum(t.nbytes for t in members) < DIVIDED_COPY_BYTES * len(members):  # mostly small: two operations
        return flatten(members).div_(divisor)
    flat = torch.empty(sum(t.numel() for t in members), dtype=members[0].dtype, device=members[0].device)
    offset = 0
    for t in members:
        torch.div(t.detach().reshape(-1), divisor, out=flat[offset : offset + t.numel()])
        offset += t.numel()
    return flat


class Layouts:
    """The layout of every plan a round may still follow, made when first asked for (by the
    training thread, for homes, or by the launcher) and dropped with the plan; the homes, laid
    out by ``homes_plan`` (DDP's buckets; None: the first plan asked for), kept until :meth:`clear`."""

    def __init__(self, index: Mapping[str, int], like: Sequence[torch.Tensor], versions: PlanVersions,
                 make: Callable[[Plan], Any] | None = None, chunk_bytes: int | None = None,
                 homes_plan: Plan | None = None) -> None:
        self.index = index
        self.like = like
        self.chunk_bytes = chunk_bytes
        self.versions = versions  # read under the exchange's lock, which callers hold
        self.make = make  # a plan's layout where the architecture has its own (sharded); else over the homes
        self._lock = threading.Lock()
        self._made: dict[int, BufferLayout] = {}  # plan version -> layout
        self._homes: GradientHomes | None = None  # laid out by the first plan, kept for the run
        self.homes_plan = homes_plan  # the plan the homes are laid out by (None: the first asked for)

    def _over_homes(self, plan: Plan) -> BufferLayout:
        if self._homes is None:
            self._homes = GradientHomes(self.homes_plan or plan, self.index, self.like, self.chunk_bytes)
        return BufferLayout(plan, self.index, self._homes)

    def of(self, adopted: Adopted) -> BufferLayout:
        with self._lock:
            # the layouts of plans no round follows any more go (the homes stay)
            self._made = {v: l for v, l in self._made.items() if v in self.versions}
            layout = self._made.get(adopted.version)
            if layout is None:
                layout = self._made[adopted.version] = (self.make or self._over_homes)(adopted.plan)
            return layout

    def clear(self) -> None:
        """Let go of the gradients' memory (the hand-off: a gradient that lives there has moved)."""
        with self._lock:
            self._made.clear()
            self._homes = None
