"""Control points: where every rank adopts the plan rank 0 made from its measurements.

At fixed rounds (after ``profile_rounds`` measured backward passes, then every
``replan_every``) rank 0 makes a plan from the median ready times of the latest rounds and
the link estimate. One broadcast carries it to every rank, always at the same point of
``optimizer.step()``, and the plan takes effect from the next round on.

Never slower than DDP where scheduling cannot help (``fallback``, unless the policy is
fifo): the first control point starts a measured trial. The policy's measured plan runs
for ``trial_rounds`` backward passes, then DDP-style buckets (fifo) for as many (one more
at the end), and rank 0 compares the median iteration times, leaving out the first round
of each arm: unless the policy is faster by at least ``fallback_gain``, every later plan
uses the buckets. The simulator's prediction of the same comparison (the measured model
on the probed link, see :mod:`gradsched.runtime.profiling`) is made at the start and
reported next to the measurement; it does not decide, because a few per cent of model
error is enough to pick the wrong side where the two are close.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..core.base import PolicyConfig
from ..core.policies import FifoConfig
from ..core.task import TensorSpec
from ..sim import Cluster, simulate
from ..sim.plan import Plan, default_ready_times, make_plan
from .config import RuntimeConfig
from .errors import failing_rank
from .exchange import Exchange
from .profiling import RoundTiming, measured_table


class Planner:
    def __init__(self, tensors: Sequence[TensorSpec], params: Sequence[torch.Tensor], policy: PolicyConfig,
                 config: RuntimeConfig, owners: dict[str, list[str]], exchange: Exchange,
                 group: dist.ProcessGroup, rank: int, world_size: int,
                 probe_group: dist.ProcessGroup | None = None, settle: Callable[[], None] | None = None) -> None:
        self.tensors = list(tensors)
        self.names = [t.name for t in self.tensors]
        self.sizes = {t.name: (p.numel(), p.element_size()) for t, p in zip(self.tensors, params)}
        self.policy = policy
        self.config = config
        self.owners = owners
        self.exchange = exchange
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.timings: list[RoundTiming] = []  # of the latest closed rounds
        self.probe_group = probe_group
        self.settle = settle  # waits until no gradient is in flight
        self.device = params[0].device
        self.link: tuple[float, float, float] | None = None  # probed (latency, seconds/byte, overhead)
        self.prediction: dict[str, Any] | None = None  # the latest simulated comparison with fifo
        self.trial: dict[str, Any] | None = None  # the measured comparison with fifo
        self.chosen = policy  # the policy of later plans: the user's, or fifo after losing the trial
        self._starts: dict[int, float] = {}  # round -> start of the forward pass before its backward
        self._done: set[int] = set()

    def adopt(self, param: str, module: str) -> None:
        """``module`` (which runs) waits for ``param`` instead of the module that holds it."""
        for names in self.owners.values():
            if param in names:
                names.remove(param)
        self.owners.setdefault(module, []).append(param)

    def record(self, timing: RoundTiming, round_index: int) -> None:
        self.timings = (self.timings + [timing])[-(self.config.profile_rounds + 1) :]
        self._starts[round_index] = timing.forward_start
        for old in [r for r in self._starts if r < round_index - 4 * self.config.trial_rounds - 4]:
            del self._starts[old]

    @property
    def trials(self) -> bool:
        """Whether the policy is measured against DDP-style buckets (see the module's doc)."""
        return self.config.fallback and self.policy.name != "fifo" and self.world_size > 1

    def _stage(self, round_index: int) -> str | None:
        """What the control point after ``round_index`` does: None (nothing), "policy" or
        "fifo" (start a trial arm), "decide" (end the trial), "replan"."""
        first = self.config.profile_rounds + 1
        every = self.config.replan_every
        if self.trials:
            k = self.config.trial_rounds
            points = {first: "policy", first + k: "fifo", first + 2 * k + 1: "decide"}
            if first <= round_index <= first + 2 * k + 1:
                return points.get(round_index)
        if round_index == first or (every and round_index > first and (round_index - first) % every == 0):
            return "replan"
        return None

    def control_point(self, round_index: int) -> None:
        """Called by ``optimizer.step()`` after round ``round_index`` on every rank."""
        stage = self._stage(round_index)
        if stage is None or round_index in self._done:
            return
        self._done.add(round_index)
        if stage == "policy" and self.link is None and self.config.architecture == "allreduce":
            self.link = self._probe()
        proposal = [self._propose(round_index, stage) if self.rank == 0 else None]
        if self.world_size > 1:
            with failing_rank("agreeing on a new plan"):
                dist.broadcast_object_list(proposal, src=0, group=self.group)
        if proposal[0] is None:
            return
        plan, prediction, trial = proposal[0]
        self.prediction = prediction or self.prediction
        self.trial = trial or self.trial
        if plan is not None:
            self.exchange.set_plan(plan, round_index + 1)

    def _iterations(self, first: int, last: int) -> list[float]:
        """Measured iteration times of rounds ``first .. last`` (forward start to forward start)."""
        return [self._starts[r + 1] - self._starts[r] for r in range(first, last + 1)
                if r in self._starts and r + 1 in self._starts]

    def _propose(self, round_index: int, stage: str) -> tuple[Plan | None, dict | None, dict | None] | None:
        timings = [t for t in self.timings[1:] if len(t.ready) == len(self.names)][-self.config.profile_rounds :]
        if timings:
            ready = {}
            for name in self.names:
                offsets = sorted(t.ready[name] - min(t.ready.values()) for t in timings)
                ready[name] = offsets[len(offsets) // 2]
        elif stage == "replan":  # the first round warms up; rounds with unused parameters are skipped
            return None
        else:
            ready = default_ready_times(self.tensors)
        est = self.exchange.estimator
        measured = est.ready and est.seconds_per_byte > 0
        link = (est.latency, est.seconds_per_byte, est.per_message) if measured else ()
        ps = self.config.architecture == "ps"
        if ps and link:  # a message was timed from push to pull: half of it each way
            link = tuple(x / 2 for x in link)
        prediction = trial = None
        if stage == "policy" and not ps and measured and timings:
            # reported next to the measured trial: the simulator's view of the same choice,
            # on the probed link (training messages also wait for the slowest rank to join)
            prediction = self._predict(timings, *(self.link or (est.latency, est.seconds_per_byte, est.per_message)))
        if stage == "decide":
            first, k = self.config.profile_rounds + 1, self.config.trial_rounds
            ours, fifo = self._iterations(first + 2, first + k), self._iterations(first + k + 2, first + 2 * k)
            if ours and fifo:
                ours_s, fifo_s = statistics.median(ours), statistics.median(fifo)
                use_fifo = ours_s > fifo_s * (1.0 - self.config.fallback_gain)
                trial = {"policy_s": ours_s, "fifo_s": fifo_s, "use_fifo": use_fifo}
                self.chosen = FifoConfig() if use_fifo else self.policy
        policy = FifoConfig() if stage == "fifo" else self.chosen
        plan = make_plan(self.tensors, ready, policy, *link, arch=self.config.architecture)
        current = self.exchange.plan_for(round_index + 1)
        if plan.messages == current.messages and plan.cross_barrier == current.cross_barrier:
            return None, prediction, trial
        return plan, prediction, trial

    def _probe(self) -> tuple[float, float, float]:
        """Measure the link once, all ranks together, with nothing else in flight: seconds
        per byte from an 8 MiB all-reduce, latency from one tiny all-reduce at a time, and
        per-message overhead from many tiny ones in flight. (Messages timed during training
        include waiting for the slowest rank to join, so they make a poor bandwidth gauge.)"""
        if self.settle:
            self.settle()
        group = self.probe_group or self.group
        big = torch.zeros(2 << 20, device=self.device)
        tiny = [torch.zeros(16, device=self.device) for _ in range(32)]

        def timed(action, repeats: int) -> float:
            action()  # warm up
            times = []
            for _ in range(repeats):
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                start = time.perf_counter()
                action()
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                times.append(time.perf_counter() - start)
            return sorted(times)[len(times) // 2]

        with failing_rank("measuring the link"):
            per_byte = timed(lambda: dist.all_reduce(big, group=group), 3) / (big.numel() * 4)
            latency = timed(lambda: dist.all_reduce(tiny[0], group=group), 5)
            overhead = timed(lambda: [w.wait() for w in [dist.all_reduce(t, group=group, async_op=True)
                                                         for t in tiny]], 3) / len(tiny)
        overhead = min(overhead, latency)
        return max(0.0, latency - overhead), per_byte, overhead

    def _predict(self, timings: list[RoundTiming], latency: float, per_byte: float,
                 overhead: float) -> dict[str, Any] | None:
        """Simulate the measured model under the policy and under fifo on the measured link.

        When the measured messages were all about one size, per-message and per-byte costs
        cannot be told apart: then the policy must win under both attributions (all of a
        message's time per byte, and all of it per message) or the buckets are used."""
        table = measured_table(timings, self.owners, self.sizes)
        if table is None:
            return None
        links = [(latency, per_byte, overhead)]
        if self.link is None and not self.exchange.estimator.separable:
            size, seconds = self.exchange.estimator.mean_queued
            links.append((latency, per_byte * 1e-3, seconds))  # (almost) everything per message
        result: dict[str, Any] = {"compute_s": table.compute_s, "latency_s": latency,
                                  "separable": len(links) == 1, "use_fifo": False}
        for k, (lat, byte_cost, over) in enumerate(links):
            ours, fifo = self._simulate_both(table, lat, byte_cost, over)
            if k == 0:
                result.update(policy_s=ours, fifo_s=fifo, comm_s=table.gradient_bytes * byte_cost, overhead_s=over)
            result["use_fifo"] |= ours > fifo * (1.0 - self.config.fallback_gain)
        return result

    def _simulate_both(self, table, latency: float, per_byte: float, overhead: float) -> tuple[float, float]:
        n = self.world_size
        cluster = Cluster(n, bandwidth_bps=8.0 * 2 * (n - 1) / n / per_byte, latency_s=latency, overhead_s=overhead)
        rounds = self.policy.build().warmup_iterations + 4
        ours = simulate(table, cluster, self.policy, iterations=rounds, record=False).iteration_s
        fifo = simulate(table, cluster, FifoConfig(), iterations=6, record=False).iteration_s
        return ours, fifo
