"""Parameter-server architecture: how messages are spread over servers, the wire format, and
the worker's side (push a message to the servers, pull the sum back).

Roles (assigned in :mod:`gradsched.runtime.comm.topology`). A job of ``W + S`` processes (``torchrun --nproc_per_node W+S``) has workers on
ranks ``0 .. W-1`` and servers on ranks ``W .. W+S-1``. Every process runs the user's script;
``gradsched.wrap`` on a server rank runs the server loop and exits the process when the
workers finish (see :mod:`gradsched.runtime.architectures.servers.server`).

Messages. The workers agree on plans exactly as with all-reduce (rank 0 proposes at the
control points), and rank 0 forwards every plan to every server. A message is one buffer
per dtype (in the order of the dtypes' names), and every buffer is cut into ``S`` near-equal
contiguous chunks, chunk ``s`` to server ``s``: every server carries the same bytes (within
one element per buffer) at every moment. (Whole messages dealt to servers would balance
bytes only over a round: all workers follow the same plan, so they would all push to the
same server at once while the others idle.) A chunk travels in pieces of about
``PIECE_BYTES`` (at most ``MAX_PIECES``), and a server answers piece by piece: the pull of a
large message starts once its first pieces are summed, not after its whole push. Piece
``p`` of chunk ``s`` of buffer ``j`` of message ``k`` travels with tag :func:`message_tag`
``(k, j, p)``, both ways, between a worker and server ``s``. Because transfers are
point-to-point and keyed by tag, no ordering between workers is needed: each worker
pushes in its own time.

Rounds. With the first message of each round a worker sends every server a header
``(round, plan version)``; the servers answer a round only once every worker announced it, with the same
plan, so a server never mixes rounds. A header of ``(-1, 0)`` says the worker is done.

Plans travel to servers in gradsched's wire format (:mod:`gradsched.runtime.comm.wire_format`: a
size, then the message; nothing is unpickled) on a separate gloo group; a size of 0 ends the
stream.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from gradsched.core.plan import PS_PIECE_BYTES, Plan, PlannedMessage
from gradsched.runtime.config import Environment
from gradsched.runtime.comm import wire_format
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.comm.wire_format import PlanUpdate
from gradsched.runtime.comm.plans import Adopted, PlanVersions
from gradsched.runtime.comm.transport import Waiter, MessageKey, Reduced, BaseTransport

HEADER_TAG = 0
MAX_DTYPES = 16
STOP = (-1, 0)
# a server sums and answers a chunk in pieces of about this size (tests cut small messages too,
# with GRADSCHED_PS_PIECE_BYTES set alike on every rank)
PIECE_BYTES = PS_PIECE_BYTES  # unless GRADSCHED_PS_PIECE_BYTES says otherwise (read when a chunk is cut)
MAX_PIECES = 64  # ... at most this many per chunk (larger pieces for larger chunks)


def message_tag(k: int, j: int, p: int = 0) -> int:
    """The tag of piece ``p`` of buffer ``j`` of message ``k`` (0 is the header's)."""
    return 1 + (MAX_DTYPES * k + j) * MAX_PIECES + p


def pieces(lo: int, hi: int, element_size: int) -> list[tuple[int, int]]:
    """(first, end) element of each piece of the chunk ``[lo, hi)``, in order."""
    step = max(1, (Environment.read().ps_piece_bytes or PIECE_BYTES) // element_size, -(-(hi - lo) // MAX_PIECES))
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def cut(numel: int, servers: int, element_size: int) -> list[list[tuple[int, int]]]:
    """How a buffer of ``numel`` elements travels: for each server in order, the (first, end)
    element of each piece of its chunk."""
    return [pieces(lo, hi, element_size) for lo, hi in chunks(numel, servers)]


def chunks(numel: int, servers: int) -> list[tuple[int, int]]:
    """(first, end) element of each server's chunk of a buffer of ``numel`` elements."""
    base, extra = divmod(numel, servers)
    bounds = [0]
    for s in range(servers):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return list(zip(bounds, bounds[1:]))


def buffer_layout(message: PlannedMessage, dtype_of: Mapping[str, torch.dtype],
                  wire: torch.dtype | None = None) -> list[tuple[torch.dtype, int]]:
    """(dtype, elements) of each buffer the message travels in, in tag order: one per dtype of its
    gradients (``dtype_of``), in the order the launcher packs them (``broadcast.by_dtype``), each
    travelling as ``wire`` where compression casts it (a float64 and a float32 group stay two
    buffers, both bf16)."""
    totals: dict[torch.dtype, int] = {}
    for name, _, numel in message.slices:
        dtype = dtype_of[name]
        totals[dtype] = totals.get(dtype, 0) + numel
    if len(totals) > MAX_DTYPES:
        raise GradschedError(f"a message holds more than {MAX_DTYPES} dtypes")
    return [(wire or d, totals[d]) for d in sorted(totals, key=str)]


def _if_done(future: torch.futures.Future, then: Callable[[], None]) -> None:
    try:
        future.value()
    except Exception:  # noqa: BLE001 - reported through the message's own future
        return
    then()


class PushPull(BaseTransport):
    """The worker's transport: push each message to the servers, pull the average back.

    It follows the plans every worker adopts (rank 0 forwards each one to the servers) and
    announces each round to the servers with the round's first message. gloo's
    point-to-point operations have no futures: a :class:`Waiter` waits for the pulls in
    launch order (the order every server answers in)."""

    def __init__(self, data_group: dist.ProcessGroup, plans_group: dist.ProcessGroup, rank: int,
                 server_ranks: Sequence[int], workers: int, dtype_of: Mapping[str, torch.dtype],
                 versions: PlanVersions, wire: torch.dtype | None = None) -> None:
        """``dtype_of``: each gradient's dtype; ``wire``: what every gradient travels as with compression."""
        self.group = data_group
        self.plans_group = plans_group
        self.rank = rank
        self.servers = list(server_ranks)
        self.workers = workers
        self.dtype_of = dict(dtype_of)
        self.wire = wire
        self._plans: dict[int, Plan] = {}  # version -> plan, for checking what is pushed
        self._round = 0  # the latest round announced to the servers
        self._held: list = []  # header and plan sends in flight, with their tensors
        self._lock = threading.Lock()  # headers are sent by the launcher, plans by the main thread
        # every server answers messages in plan order, so pulls complete in launch order
        self._waiter = Waiter(lambda k, exc: GradschedError(f"push/pull of message {k} with the servers "
                                                            f"{self.servers} failed: {exc}"))
        self._send_waiter = Waiter()  # when each message's push is done (pushes finish in order too)
        versions.subscribe(self._adopted)

    def _adopted(self, adopted: Adopted) -> None:
        with self._lock:
            self._plans[adopted.version] = adopted.plan
        if self.rank == 0:
            for server in self.servers:
                self._hold(*wire_format.send("plan", PlanUpdate(adopted.version, adopted.plan), server, self.plans_group))

    def _header(self, round_index: int, version: int) -> None:
        header = torch.tensor([round_index, version], dtype=torch.int64)
        for server in self.servers:
            self._hold([dist.isend(header, group_dst=server, group=self.group, tag=HEADER_TAG)], [header])

    def _hold(self, works: list, tensors: list) -> None:
        with self._lock:
            self._held = [h for h in self._held if not all(w.is_completed() for w in h[0])]
            self._held.append((works, tensors))

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        pass  # the servers divide the sum

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        if key.round != self._round:  # the round's first message: announce the round first
            self._round = key.round
            self._header(key.round, key.version)
        with self._lock:
            for old in [v for v in self._plans if v < key.version]:
                del self._plans[old]
            message = self._plans[key.version].messages[key.index]
        layout = buffer_layout(message, self.dtype_of, self.wire)
        if [(b.dtype, b.numel()) for b in buffers] != layout:
            raise GradschedError(f"message {key.index}: buffers {[(b.dtype, b.numel()) for b in buffers]} "
                                 f"!= layout {layout}")
        # The average comes back into the buffer it was pushed from: a server answers a piece
        # only once it received all of it from every worker, so by the time the first byte
        # of the answer arrives, this rank's send has read the whole piece.
        sends, receives = [], []
        for j, buffer in enumerate(buffers):
            by_server = cut(buffer.numel(), len(self.servers), buffer.element_size())
            for p in range(max(len(c) for c in by_server)):  # piece p to every server, then piece p + 1
                for server, chunk in zip(self.servers, by_server):
                    if p < len(chunk):
                        (a, b), tag = chunk[p], message_tag(key.index, j, p)
                        sends.append(dist.isend(buffer[a:b], group_dst=server, group=self.group, tag=tag))
                        receives.append(dist.irecv(buffer[a:b], group_src=server, group=self.group, tag=tag))
        # Each gloo operation is waited for by one thread only (a wait consumes its
        # completion): the sends by one waiter, whose future the pulls' waiter then waits for.
        sent = self._send_waiter.track(sends, key.index)
        if on_sent is not None:  # a failed send fails the message's future too: reported there
            sent.add_done_callback(lambda future: _if_done(future, on_sent))
        pulled = self._waiter.track([sent, *receives], key.index, list(buffers))
        return [pulled] * len(buffers)  # CPU only (parameter servers run on gloo): one future serves all

    def close(self, wait: bool) -> None:
        self._waiter.stop(5.0 if wait else 0.5)  # it waits for the send waiter's futures: first
        self._send_waiter.stop(5.0 if wait else 0.5)
        if wait:
            self._header(*STOP)
            if self.rank == 0:
                for server in self.servers:
                    self._hold(*wire_format.send("plan", None, server, self.plans_group))
            for works, _ in self._held:
                for work in works:
                    work.wait()
        self._held.clear()
        self.group = self.plans_group = None
