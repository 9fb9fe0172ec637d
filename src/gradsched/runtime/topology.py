"""Roles and process groups of a wrapped model.

With all-reduce every rank is a worker. With parameter servers (``architecture="ps"``) a
job of ``W + S`` processes has workers on ranks ``0 .. W-1`` and servers on the last ``S``
ranks (see :mod:`gradsched.runtime.ps`).

gradsched communicates on process groups of its own, created by every rank in the same
order, so that nothing it sends can be confused with the user's collectives:

* ``control``: workers (gloo, CPU): plans, unused-parameter agreement, the link probe;
* ``data``: every rank, the user's backend: gradients (all-reduce, or push and pull);
* ``buffers``: workers, the user's backend: buffers (BatchNorm statistics);
* ``plans`` (ps only): every rank (gloo): plans forwarded to servers, and checks at wrap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from .config import RuntimeConfig
from .errors import GradschedError, entry


# every group gradsched made in this process: destroyed at exit (gradsched.runtime.wrap),
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


@dataclass
class Topology:
    rank: int
    world_size: int
    workers: list[int]
    servers: list[int]
    groups: dict[str, dist.ProcessGroup] = field(repr=False)

    @classmethod
    def create(cls, config: RuntimeConfig) -> Topology:
        """Every rank's roles and gradsched's groups (a collective: every rank must call it)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        workers, servers = roles(world, config.servers if config.architecture == "ps" else 0)
        wait = timedelta(seconds=config.timeout)
        if servers:
            groups = {  # every rank creates every group, in the same order
                "control": dist.new_group(workers, backend="gloo", timeout=wait),
                "data": dist.new_group(timeout=wait),
                "buffers": dist.new_group(workers, timeout=wait),
                "plans": dist.new_group(backend="gloo", timeout=wait),
            }
        else:
            groups = {
                "control": dist.new_group(backend="gloo", timeout=wait),
                "data": dist.new_group(timeout=wait),
                "buffers": dist.new_group(timeout=wait),
            }
        _CREATED.extend(groups.values())
        return cls(rank, world, workers, servers, groups)

    @property
    def is_server(self) -> bool:
        return self.rank in self.servers

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def everyone(self) -> dist.ProcessGroup:
        """A gloo group of every rank, workers and servers (for checks at wrap time)."""
        return self.group("plans" if self.servers else "control")

    def group(self, name: str) -> dist.ProcessGroup:
        if name not in self.groups:
            raise GradschedError(f"process group {name!r} is not available (released, or not used by this role)")
        return self.groups[name]

    def release(self) -> None:
        """Drop the references to the groups. The objects that use them form cycles (hooks
        refer back to them), so otherwise the groups would be freed by the garbage collector
        at some later point, possibly while the interpreter exits, where a backend torn
        down can abort the process."""
        self.groups = {}
