"""The parameter server loop (see :mod:`gradsched.runtime.architectures.servers.pushpull` for roles and wire format).

A server serves rounds one at a time. It waits for every worker's header of the round
(all must name the same round and plan), takes the plan (received from rank 0 when it was
adopted), posts a receive of each piece of its chunk of every message from each worker
(:func:`gradsched.runtime.architectures.servers.pushpull.cut`), and then, piece by piece in plan order (the order
every worker pushes in), sums the workers' pieces in worker order, divides the sum by the
number of workers and sends this average back to every worker. (DDP divides before
summing; dividing the sum does the same work once on a server instead of on every worker,
and with two workers gives the same bits.)

The receive buffers of a plan are kept from round to round: a round's answers are all sent
before the next round's receives are posted.

The optimizer runs on the workers, so any optimizer works, and the server holds no
parameters: only the buffers of the round it serves.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist

from gradsched.core.plan import Plan
from gradsched.runtime.comm import wire_format
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.comm.topology import Topology
from gradsched.runtime.architectures.servers.pushpull import HEADER_TAG, STOP, buffer_layout, cut, message_tag


class Server:
    def __init__(self, topology: Topology, dtype_of: Mapping[str, torch.dtype], timeout_s: float,
                 wire: torch.dtype | None = None) -> None:
        """``dtype_of``: each gradient's dtype; ``wire``: what every gradient travels as with compression."""
        self.rank = topology.rank
        self.workers = list(topology.workers)
        self.servers = list(topology.servers)
        self.me = self.servers.index(self.rank)
        self.dtype_of = dict(dtype_of)
        self.wire = wire
        self.group = topology.data
        self.plans_group = plans_group = topology.plans
        self.timeout = timedelta(seconds=timeout_s)
        self.plans: dict[int, Plan] = {}
        self._buffers: tuple[int, dict[tuple[int, int, int], list[torch.Tensor]]] | None = None  # (plan, buffers)
        self.rounds = 0
        self.bytes_in = 0
        self._plans_done = False
        self._size = torch.zeros(1, dtype=torch.int64)
        self._size_work = dist.irecv(self._size, group_src=0, group=plans_group)

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            raise GradschedError(
                f"parameter server rank {self.rank}: {what} failed: a worker died, is stuck or is unreachable ({exc})"
            ) from exc

    def _receive_plan(self) -> None:
        """Take the next object of rank 0's plan stream (a plan, or its end)."""
        try:
            got = wire_format.receive("plan", 0, self.plans_group, self._size, self._size_work)
        except GradschedError:
            raise
        except RuntimeError as exc:
            raise GradschedError(f"parameter server rank {self.rank}: receiving a plan from rank 0 failed ({exc})") from exc
        if got is None:
            self._plans_done = True
            return
        wire_format.check_plan_names(got.plan, self.dtype_of, "rank 0")
        self.plans[got.version] = got.plan
        self._size = torch.zeros(1, dtype=torch.int64)
        self._size_work = dist.irecv(self._size, group_src=0, group=self.plans_group)

    def _plan(self, version: int) -> Plan:
        while version not in self.plans:
            if self._plans_done:
                raise GradschedError(f"parameter server rank {self.rank}: plan {version} was never sent")
            self._receive_plan()
        for old in [v for v in self.plans if v < version]:
            del self.plans[old]
        return self.plans[version]

    def _post_headers(self) -> dict[int, tuple[torch.Tensor, dist.Work]]:
        posted = {}
        for w in self.workers:
            header = torch.zeros(2, dtype=torch.int64)
            posted[w] = (header, dist.irecv(header, group_src=w, group=self.group, tag=HEADER_TAG))
        return posted

    def run(self) -> None:
        """Serve rounds until every worker said it is done, then let go of the groups."""
        headers = self._post_headers()
        while True:
            announced = self._next_round(headers)
            if announced is None:
                break
            round_index, version = announced
            received = self._post_receives(version)
            headers = self._post_headers()  # after this round's receives: the order NCCL would need
            self._answer(round_index, received)
            self.rounds += 1
        while not self._plans_done:  # rank 0 ends the plan stream when it closes
            self._receive_plan()
        self.group = self.plans_group = None

    def _next_round(self, headers: dict[int, tuple[torch.Tensor, dist.Work]]) -> tuple[int, int] | None:
        """(round, plan version) every worker announced; None once all are done."""
        seen = {}
        for w, (header, work) in headers.items():
            self._wait(work, f"waiting for worker rank {w} to start a round")
            seen[w] = tuple(int(v) for v in header.tolist())
        if all(v == STOP for v in seen.values()):
            return None
        if len(set(seen.values())) != 1:
            raise GradschedError(
                f"parameter server rank {self.rank}: workers disagree on the round after round {self.rounds} "
                f"(round, plan) by worker: {seen}; every worker must run the same number of backward passes"
            )
        return next(iter(seen.values()))

    def _post_receives(self, version: int) -> dict[tuple[int, int, int], list[tuple[torch.Tensor, dist.Work]]]:
        """Receives of this server's chunk of every buffer of every message, piece by piece,
        from every worker."""
        received = {}
        for (k, j, p), buffers in self._receive_buffers(version).items():
            received[(k, j, p)] = [(buffer, dist.irecv(buffer, group_src=w, group=self.group, tag=message_tag(k, j, p)))
                                   for w, buffer in zip(self.workers, buffers)]
        return received

    def _receive_buffers(self, version: int) -> dict[tuple[int, int, int], list[torch.Tensor]]:
        """One buffer per worker for each piece of this server's chunk of every (message,
        dtype) of the plan, in plan order."""
        if self._buffers is None or self._buffers[0] != version:
            buffers = {}
            for k, message in enumerate(self._plan(version).messages):
                for j, (dtype, total_numel) in enumerate(buffer_layout(message, self.dtype_of, self.wire)):
                    for p, (a, b) in enumerate(cut(total_numel, len(self.servers), dtype.itemsize)[self.me]):
                        buffers[(k, j, p)] = [torch.empty(b - a, dtype=dtype) for _ in self.workers]
            self._buffers = (version, buffers)
        return self._buffers[1]

    def _answer(self, round_index: int,
                received: dict[tuple[int, int, int], list[tuple[torch.Tensor, dist.Work]]]) -> None:
        """Average each piece over the workers (summed in worker order), in plan order, and
        send it back."""
        sends: list[tuple[dist.Work, torch.Tensor]] = []
        for (k, j, p), slots in received.items():
            total = None
            for w, (buffer, work) in zip(self.workers, slots):
                self._wait(work, f"receiving message {k} of round {round_index} from worker rank {w}")
                total = _accumulator(buffer) if total is None else total.add_(buffer)
                self.bytes_in += buffer.numel() * buffer.element_size()
            total.div_(len(self.workers))
            answer = total.to(slots[0][0].dtype)  # the wire dtype again (no copy without compression)
            for w in self.workers:
                sends.append((dist.isend(answer, group_dst=w, group=self.group, tag=message_tag(k, j, p)), answer))
        for work, _ in sends:
            self._wait(work, f"sending round {round_index} back to the workers")


def _accumulator(first: torch.Tensor) -> torch.Tensor:
    """Where a chunk's sum accumulates: the first worker's buffer itself, or a float32 copy of
    it when the workers push half precision (compression), so that summing does not round
    (or, in float16, overflow) before the division."""
    return first.float() if first.dtype in (torch.float16, torch.bfloat16) else first
