"""The order of the data group on one rank, traced exactly: gradsched's launcher thread issues
every operation on the data group (messages, and the jobs the training thread queues: buffer
broadcasts, link probes), and a job runs before the first message of the round that had not
begun on this rank when it was queued, however far behind the launcher is. A real one-rank
gloo group reduces; a gate in front of it holds the launcher back at a chosen message."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.comm.plans import PlanVersions, tensor_specs
from gradsched.runtime.comm.transport import AllReduce
from gradsched.runtime.device.host import HostDevice


class Gated(AllReduce):
    """gloo's all-reduce, each send written to ``trace``; the send of ``hold`` waits for ``gate``."""

    def __init__(self, trace: list, hold: tuple[int, int]) -> None:
        super().__init__(dist.group.WORLD)
        self.trace, self.hold, self.gate = trace, hold, threading.Event()

    def send(self, key, buffers, on_sent=None):
        if (key.round, key.index) == self.hold:
            assert self.gate.wait(30), "the test never opened the gate"
        self.trace.append(f"round {key.round} message {key.index}")
        return super().send(key, buffers, on_sent)


def _exchange(trace: list, hold: tuple[int, int]) -> tuple[Exchange, Gated, list[torch.Tensor]]:
    params = [torch.zeros(4), torch.zeros(4)]
    plan = Plan("priority", True, (PlannedMessage((("a", 0, 4),), 16, "a", None, 0.0, 1.0),
                                   PlannedMessage((("b", 0, 4),), 16, "b", None, 1.0, 2.0)), span_s=2.0)
    transport = Gated(trace, hold)
    exchange = Exchange(tensor_specs(["a", "b"], params), params, PlanVersions(plan), transport, HostDevice(), 30.0)
    return exchange, transport, params


def test_a_job_queued_once_a_round_began_runs_after_that_round_though_the_launcher_lags(world_of_one):
    trace: list[str] = []
    exchange, transport, params = _exchange(trace, hold=(1, 1))
    try:
        for i in (0, 1):
            exchange.mark_ready(i, torch.ones(4), 1)
        exchange.wait_reduced([0], "a")  # message 0 of round 1 is done; message 1 is held at the gate
        exchange.mark_ready(0, torch.ones(4), 2)  # round 2 has begun here; the launcher is still in round 1
        job = exchange.after_launched(lambda: trace.append("job") or "ran")
        transport.gate.set()
        exchange.wait_reduced([1], "b")
        exchange.mark_ready(1, torch.ones(4), 2)
        exchange.wait_reduced([0, 1], "everything")
        assert job() == "ran"  # round 3 never begins: the job still runs once round 2 is launched
        assert trace == ["round 1 message 0", "round 1 message 1", "round 2 message 0", "round 2 message 1", "job"]
    finally:
        exchange.close()


def test_a_job_queued_before_a_round_began_runs_before_its_first_message(world_of_one):
    trace: list[str] = []
    exchange, transport, params = _exchange(trace, hold=(0, 0))  # nothing held
    try:
        job = exchange.after_launched(lambda: trace.append("job"))
        for i in (0, 1):
            exchange.mark_ready(i, torch.ones(4), 1)
        exchange.wait_reduced([0, 1], "everything")
        job()
        assert trace == ["job", "round 1 message 0", "round 1 message 1"]
    finally:
        exchange.close()
