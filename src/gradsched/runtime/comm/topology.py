"""Roles and process groups of a wrapped model.

With all-reduce (and sharded) every rank is a worker. With parameter servers a job of ``W + S``
processes has workers on ranks ``0 .. W-1`` and servers on the last ``S`` ranks (see
:mod:`gradsched.runtime.architectures.servers`).

gradsched communicates on process groups of its own, created by every rank in the same
order, so that nothing it sends can be confused with the user's collectives:

* ``control``: workers (gloo, CPU): plans, unused-parameter agreement, join's agreements;
* ``data``: every rank, the user's backend: gradients (all-reduce, or push and pull), and
  the link probe;
* ``broadcasts`` (all-reduce and sharded): every rank, the user's backend: buffers (BatchNorm
  statistics) before a forward pass. A communicator of their own: on NCCL every collective of
  one communicator runs on one stream, in order, so a broadcast on ``data`` would wait for
  every message of the round before it, and the first layer with buffers with it;
* ``buffers``: workers (gloo): buffers with parameter servers, join's final copy of the model;
* ``plans`` (ps only): every rank (gloo): plans forwarded to servers, and checks at wrap;
* ``tensors`` (sharded): every rank, the user's backend: what torch issues on the DTensor
  gradients sharding hands out (a norm), apart from the data plane's order;
* ``gathers`` (fully sharded): every rank, the user's backend: the parameters' all-gathers
  before each module's forward and backward pass, issued by the gathering thread
  (:mod:`gradsched.runtime.architectures.sharded.full`) in the order of its queue.

Each group has one thread that issues on it, in an order every rank shares: ``data`` and
``broadcasts`` the launcher (:mod:`gradsched.runtime.comm.launcher`; at wrap time, before the
launcher starts, the training thread), the others the training thread (or, inside
``backward()``, autograd's thread while the training thread waits for it). So the
communicators of the user's backend (NCCL, say) are driven from one thread, in one order on
every rank, and the gloo groups each from one thread at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import timedelta

import torch.distributed as dist

from gradsched.runtime import torch_api
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.errors import GradschedError, entry


#: NCCL's watchdog aborts the process once a collective exceeds its group's timeout, before any
#: future reports it: the data group's is this much longer than gradsched's own ``timeout``, so
#: gradsched's wait for a reduction expires first and its error names the rank that stopped
NCCL_WATCHDOG_MARGIN = timedelta(seconds=60)

# every group gradsched made in this process: destroyed at exit (gradsched.runtime.frontend.wrap),
# while the interpreter is whole, not in its teardown
_CREATED: list[dist.ProcessGroup] = []


def destroy_created() -> None:
    """Destroy the process groups gradsched created that still exist. Left to the
    interpreter's teardown, a gloo group's threads can free tensors (and callbacks) that refer
    to Python objects after Python has gone, which aborts the process; this runs from an
    ``atexit`` handler, after the coordinators closed, and the user's own default group is
    left to them (``destroy_process_group()``)."""
    while _CREATED:
        group = _CREATED.pop()
        try:
            dist.destroy_process_group(group)
        except (ValueError, RuntimeError, AssertionError):  # gone already, with the default group
            pass


def roles(world_size: int, servers: int) -> tuple[list[int], list[int]]:
    """(worker ranks, server ranks) of a job of ``world_size`` processes."""
    if servers < 1:
        return list(range(world_size)), []
    if world_size <= servers:
        raise GradschedError(
            f"{entry()}: {world_size} processes cannot hold {servers} servers and at least one worker; "
            f"launch workers + servers processes (e.g. torchrun --nproc_per_node {servers + 2} for 2 workers)"
        )
    workers = world_size - servers
    return list(range(workers)), list(range(workers, world_size))


@dataclass(frozen=True)
class Groups:
    """gradsched's process groups (see above)."""

    control: dist.ProcessGroup | None  # None (or a non-member) on a server: workers only
    data: dist.ProcessGroup
    buffers: dist.ProcessGroup | None
    plans: dist.ProcessGroup | None = None  # parameter servers only
    broadcasts: dist.ProcessGroup | None = None  # all-reduce and sharded only
    tensors: dist.ProcessGroup | None = None  # sharded only: what torch issues on its DTensor gradients
    gathers: dist.ProcessGroup | None = None  # fully sharded only: the parameters' all-gathers


@dataclass
class Topology:
    rank: int
    world_size: int
    workers: list[int]
    servers: list[int]
    groups: Groups | None = field(repr=False)  # None once released

    @classmethod
    def create(cls, config: RuntimeConfig, group: dist.ProcessGroup | None = None, servers: int = 0,
               tensors: bool = False, gathers: bool = False) -> Topology:
        """Every rank's roles (the last ``servers`` ranks serve) and gradsched's groups among the
        ranks of ``group`` (the default group if None): a collective, every rank of ``group`` must
        call it. Ranks here are ``group``'s, as are those of every gradsched group made from it.
        ``tensors``: a group for the collectives torch issues on DTensors gradsched hands the
        user (sharded gradients), apart from the data plane's order."""
        group = group if group is not None else dist.group.WORLD
        if group is dist.GroupMember.NON_GROUP_MEMBER or dist.get_rank(group) < 0:
            raise GradschedError(f"{entry()}: this rank is not a member of the process_group it was given")
        members = dist.get_process_group_ranks(group)  # the global rank of each rank of the group
        rank, world = dist.get_rank(group), len(members)
        workers, servers = roles(world, servers)
        wait = timedelta(seconds=config.timeout)
        everywhere = world == dist.get_world_size()  # the whole job: every rank creates every group

        def new(among: list[int] | None, backend: str | None = None,
                wait: timedelta = wait) -> dist.ProcessGroup | None:
            """A group of the ranks ``among`` of ``group`` (None: all of them). Over a part of
            the job, only its members create it (the others need not wrap at the same time);
            gradsched's groups of one wrap are then made in the same order on every member."""
            among = list(range(world)) if among is None else among
            ranks = [members[r] for r in among]  # in the order of group's ranks
            if everywhere:
                return torch_api.new_group(ranks, backend, wait)
            if rank not in among:
                return None
            return torch_api.new_group(ranks, backend, wait, local=True)

        parts = workers if servers else None  # with servers, every rank creates every group, in the same order
        # the groups of every rank first: a part of the job then agrees on the rest's names
        backend_wait = wait + NCCL_WATCHDOG_MARGIN if "nccl" in str(dist.get_backend(group)) else wait
        data = new(None, wait=backend_wait)
        plans = new(None, "gloo") if servers else None
        groups = Groups(control=new(parts, "gloo"), data=data, buffers=new(parts, "gloo"), plans=plans,
                        broadcasts=None if servers else new(None, wait=backend_wait),
                        tensors=new(None, wait=backend_wait) if tensors else None,
                        gathers=new(None, wait=backend_wait) if gathers else None)
        _CREATED.extend(g for g in (getattr(groups, f.name) for f in fields(groups)) if g is not None)
        return cls(rank, world, workers, servers, groups)

    def _group(self, name: str) -> dist.ProcessGroup:
        group = None if self.groups is None else getattr(self.groups, name)
        if group is None:
            raise GradschedError(f"process group {name!r} is not available (released, or not used by this role)")
        return group

    @property
    def control(self) -> dist.ProcessGroup:
        return self._group("control")

    @property
    def data(self) -> dist.ProcessGroup:
        return self._group("data")

    @property
    def buffers(self) -> dist.ProcessGroup:
        return self._group("buffers")

    @property
    def broadcasts(self) -> dist.ProcessGroup:
        return self._group("broadcasts")

    @property
    def plans(self) -> dist.ProcessGroup:
        return self._group("plans")

    @property
    def tensors(self) -> dist.ProcessGroup:
        return self._group("tensors")

    @property
    def gathers(self) -> dist.ProcessGroup:
        return self._group("gathers")

    @property
    def is_server(self) -> bool:
        return self.rank in self.servers

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def everyone(self) -> dist.ProcessGroup:
        """A gloo group of every rank, workers and servers (for checks at wrap time)."""
        return self.plans if self.servers else self.control

    def release(self) -> None:
        """Drop the references to the groups. The objects that use them form cycles (hooks
        refer back to them), so otherwise the groups would be freed by the garbage collector
        at some later point, possibly while the interpreter exits, where a backend torn
        down can abort the process."""
        self.groups = None
