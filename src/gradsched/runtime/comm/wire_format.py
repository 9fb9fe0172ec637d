"""The wire format of everything ranks send each other besides gradients: plans (to the
workers and to parameter servers), rank 0's proposals at control points, each rank's timing
there, and each rank's wrap-time checks. Nothing received is unpickled: a message is MessagePack (msgspec), decoded
into the exact types expected, so a received message can build nothing but plain data.

A message is an envelope ``[FORMAT, VERSION, kind, body]``; the body is the MessagePack of
one of :data:`KINDS`. Decoding checks, in order, that the bytes are MessagePack, that the
envelope names this format, that the version is this one (ranks of different gradsched
versions fail here, with both versions named), that the kind is the one expected, and that
the body has every field of the expected type. Any failure raises :class:`WireFormatError`
naming the sender and what was wrong, before anything is done with the message: a malformed
or foreign message never reaches parameters.

>>> from gradsched.core.plan import Plan, PlannedMessage
>>> plan = Plan("fifo", False, (PlannedMessage((("w", 0, 4),), 16, "w", None, 0.0, 1.0),), 1.0)
>>> decode(encode("plan", PlanUpdate(3, plan)), "plan", "rank 0") == PlanUpdate(3, plan)
True
>>> decode(b"\\x80\\x03}q\\x00.", "plan", "rank 0")  # a pickle
Traceback (most recent call last):
...
gradsched.runtime.comm.wire_format.WireFormatError: a message from rank 0 is not a gradsched message: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Sequence

import msgspec
import torch
import torch.distributed as dist

from gradsched.control.arms import TrialReport, TuningReport
from gradsched.core.plan import Plan
from gradsched.core.task import TensorSpec
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.diagnostics.stats import Prediction

FORMAT = "gradsched"
VERSION = 7  # raise on any change to an envelope or a body type


class WireFormatError(GradschedError):
    """A received message that is not a well-formed gradsched message of the expected kind."""


class _Envelope(msgspec.Struct, array_like=True):
    format: str
    version: int
    kind: str
    body: msgspec.Raw


@dataclass(frozen=True)
class PlanUpdate:
    """A plan and its version number, as rank 0 sends it to parameter servers."""

    version: int
    plan: Plan


@dataclass(frozen=True)
class Proposal:
    """What rank 0 broadcasts at a control point."""

    plan: Plan | None  # None: keep the plan in use
    prediction: Prediction | None = None
    trial: TrialReport | None = None
    tuning: TuningReport | None = None
    more_pairs: int = 0  # the measured trial measures this many pairs more first: every rank's schedule grows


@dataclass(frozen=True)
class RankChecks:
    """What every rank tells the others at wrap time (see :mod:`gradsched.runtime.frontend.checks`)."""

    structure: list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype) of every parameter
    config: str  # the policy and runtime configuration, as sorted JSON
    sums: list[tuple[float, float]]  # sum and sum of squares of every parameter


@dataclass(frozen=True)
class StateKeys:
    """What optimizer state a rank holds for its shards (see
    :meth:`gradsched.runtime.architectures.sharded.stepping.ShardedStep.full_state_dict`)."""

    keys: list[tuple[int, str]]  # (parameter index, state key) of every shard-sized tensor


@dataclass(frozen=True)
class RankTiming:
    """What every rank tells the others at a control point of its own compute (see
    :mod:`gradsched.control.ranks`): medians over its latest measured rounds."""

    backward_s: float | None  # its backward pass, the end of its forward pass to its last gradient (None: none yet)
    ready: list[float]  # each planned gradient's ready time, from the round's first, in the plans' order (or [])
    spans: list[float] = field(default_factory=list)  # its backward pass in each of its latest rounds (bursts)
    link_probes: list[float] = field(default_factory=list)  # its probe transfers to the next rank of the ring, the
    # latest (3+ ranks; one per control point, oldest first; empty: not probed)
    ranks_per_host: int = 1  # the ranks on its host (LOCAL_WORLD_SIZE): the links judged are the hosts'


KINDS: dict[str, type] = {"plan": PlanUpdate, "proposal": Proposal, "checks": RankChecks, "state_keys": StateKeys,
                          "rank_timing": RankTiming}
_ENCODER = msgspec.msgpack.Encoder()


def encode(kind: str, body: Any) -> bytes:
    """The message of ``kind`` carrying ``body`` (an instance of ``KINDS[kind]``)."""
    expected = KINDS[kind]
    if not isinstance(body, expected):
        raise TypeError(f"a {kind!r} message carries a {expected.__name__}, not a {type(body).__name__}")
    return _ENCODER.encode(_Envelope(FORMAT, VERSION, kind, msgspec.Raw(_ENCODER.encode(body))))


def decode(data: bytes | bytearray | memoryview, kind: str, sender: str) -> Any:
    """The body of a message of ``kind`` received from ``sender`` (words, for errors)."""
    try:
        envelope = msgspec.msgpack.decode(data, type=_Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"a message from {sender} is not a gradsched message: {exc}") from None
    if envelope.format != FORMAT:
        raise WireFormatError(f"a message from {sender} is not a gradsched message (format {envelope.format!r})")
    if envelope.version != VERSION:
        raise WireFormatError(f"{sender} speaks gradsched wire format version {envelope.version}, this rank "
                              f"version {VERSION}: run the same gradsched version on every rank")
    if envelope.kind != kind:
        raise WireFormatError(f"expected a {kind!r} message from {sender}, got a {envelope.kind!r} message")
    try:
        return msgspec.msgpack.decode(envelope.body, type=KINDS[kind])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"a malformed {kind!r} message from {sender}: {exc}") from None


def check_plan(plan: Plan, tensors: Sequence[TensorSpec], sender: str) -> None:
    """Refuse a well-formed plan that does not cover this rank's gradients exactly once."""
    try:
        plan.check(tensors)
    except ValueError as exc:
        raise WireFormatError(f"a plan from {sender} does not fit this rank's gradients: {exc}") from None


def check_plan_names(plan: Plan, names: Collection[str], sender: str) -> None:
    """Refuse a plan naming a tensor this rank does not know (a parameter server, which
    knows names and dtypes only)."""
    unknown = sorted({name for m in plan.messages for name, _, _ in m.slices} - set(names))
    if unknown:
        raise WireFormatError(f"a plan from {sender} names tensors this rank does not have, e.g. {unknown[0]!r}")


# -- moving messages between ranks (gloo groups; the bytes travel as uint8 tensors) ---------
def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _received(n: int) -> tuple[bytearray, torch.Tensor]:
    """Memory for ``n`` bytes to receive into, as a uint8 tensor over a bytearray: what arrives
    is read from the bytearray (no numpy: torch alone must do)."""
    memory = bytearray(n)
    return memory, torch.frombuffer(memory, dtype=torch.uint8)


LIMIT = 1 << 30  # bytes: no gradsched message comes near (a plan of a million messages is ~50 MB)


def _size(n: int, sender: str) -> int:
    """A size a peer announced, refused before anything is allocated if no message has it."""
    if not 0 < n <= LIMIT:
        raise WireFormatError(f"{sender} announced a message of {n} bytes: not a gradsched message")
    return n


def broadcast(kind: str, body: Any, src: int, group: dist.ProcessGroup | None) -> Any:
    """Rank ``src`` sends ``body`` to every rank of ``group``; each returns it, decoded."""
    mine = dist.get_rank(group) == src  # ranks of the group, as every rank of gradsched's
    payload = _tensor(encode(kind, body)) if mine else None
    size = torch.tensor([payload.numel() if mine else 0], dtype=torch.int64)
    dist.broadcast(size, group_src=src, group=group)
    if not mine:
        memory, payload = _received(_size(int(size.item()), f"rank {src}"))
    dist.broadcast(payload, group_src=src, group=group)
    return body if mine else decode(bytes(memory), kind, f"rank {src}")


def all_gather(kind: str, body: Any, group: dist.ProcessGroup | None, device: torch.device | None = None) -> list[Any]:
    """Every rank's ``body``, decoded, in rank order of ``group`` (``device``: where the group's
    backend takes its tensors, CUDA for NCCL; the bytes travel there and back)."""
    there = device is not None and device.type != "cpu"
    moved = (lambda t: t.to(device)) if there else (lambda t: t)
    payload = _tensor(encode(kind, body))
    world = dist.get_world_size(group)
    sizes = [moved(torch.zeros(1, dtype=torch.int64)) for _ in range(world)]
    dist.all_gather(sizes, moved(torch.tensor([payload.numel()], dtype=torch.int64)), group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else range(world)
    longest = max(_size(int(n.item()), f"rank {rank}") for rank, n in zip(ranks, sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: payload.numel()] = payload
    received = [_received(longest) for _ in range(world)]
    arrived = [moved(torch.empty(longest, dtype=torch.uint8)) if there else tensor for _, tensor in received]
    dist.all_gather(arrived, moved(padded), group=group)
    for (_, tensor), came in zip(received, arrived):
        if came is not tensor:
            tensor.copy_(came.cpu())
    return [decode(bytes(memory[: int(size.item())]), kind, f"rank {rank}")
            for rank, (memory, _), size in zip(ranks, received, sizes)]


def send(kind: str, body: Any | None, dst: int, group: dist.ProcessGroup) -> tuple[list, list]:
    """Start sending ``body`` to ``dst`` as a size, then the message (``None``: a size of 0,
    the end of the stream). Returns the works and the tensors that must stay alive until
    they complete."""
    if body is None:
        size = torch.zeros(1, dtype=torch.int64)
        return [dist.isend(size, group_dst=dst, group=group)], [size]
    payload = _tensor(encode(kind, body))
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    return [dist.isend(size, group_dst=dst, group=group), dist.isend(payload, group_dst=dst, group=group)], [size, payload]


def receive(kind: str, src: int, group: dist.ProcessGroup, size: torch.Tensor, size_work: dist.Work) -> Any | None:
    """Finish receiving what :func:`send` sent, whose size ``irecv`` (into ``size``) was
    posted earlier: the body, or None at the end of the stream."""
    size_work.wait()
    n = int(size.item())
    if n == 0:
        return None
    memory, payload = _received(_size(n, f"rank {src}"))
    dist.recv(payload, group_src=src, group=group)
    return decode(bytes(memory), kind, f"rank {src}")
