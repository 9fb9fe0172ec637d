"""The parameter-server link the planner makes plans for, recovered from messages timed
push to pull on the simulator's own push-then-pull network."""

from __future__ import annotations

import random

import pytest

from gradsched.core.estimator import CompletionTimer, LinkEstimator
from gradsched.runtime.architectures.servers import ParameterServers
from gradsched.sim.network import PushPull

LATENCY, PER_BYTE, OVERHEAD = 2e-4, 8e-9, 1e-4  # one direction: 125 MB/s


def _estimate(seed: int) -> LinkEstimator:
    """Rounds of messages launched together (queued behind each other), then a few alone."""
    rng = random.Random(seed)
    network, estimator = PushPull(LATENCY, PER_BYTE, OVERHEAD), LinkEstimator()
    timer = CompletionTimer(estimator)
    now = 0.0
    for _ in range(6):
        sizes = [rng.randint(50_000, 4_000_000) for _ in range(12)]
        transfers = [(size, network.submit(size, now)) for size in sizes]
        for k, (size, transfer) in enumerate(transfers):
            timer.finished(size, now, idle_at_launch=k == 0, now=transfer.complete)
        now = transfers[-1][1].complete + 0.01
        for size in (rng.randint(20_000, 200_000), rng.randint(2_000_000, 4_000_000)):  # alone on an idle link
            transfer = network.submit(size, now)
            timer.finished(size, now, idle_at_launch=True, now=transfer.complete)
            now = transfer.complete + 0.01
    return estimator


@pytest.mark.parametrize("seed", range(3))
def test_one_direction_of_a_push_pull_link_is_recovered(seed):
    estimator = _estimate(seed)
    latency, per_byte, overhead = ParameterServers(1).link_model().link(estimator.latency, estimator.seconds_per_byte, estimator.per_message)
    # within 10%, on the slow side: a larger message's push can leave a gap before its pull
    # (halving it, as the planner once did, plans for twice the bandwidth)
    assert PER_BYTE <= per_byte <= 1.1 * PER_BYTE
    # a lone message's fixed time, push and pull, is twice one direction's (the queued fit
    # may put all of it in the latency: the sum is what a plan sees of a lone message)
    assert latency + overhead == pytest.approx(LATENCY + OVERHEAD, rel=0.1)
