"""Control points: where every rank adopts the plan rank 0 made from its measurements.

At fixed rounds (after ``profile_rounds`` measured backward passes, then every
``replan_every``) rank 0 makes a plan from the median ready times of the latest rounds and
the link estimate. One broadcast carries it to every rank, always at the same point of
``optimizer.step()``, and the plan takes effect from the next round on.

Measured arms. From the first control point on, rank 0 measures *arms* of
``trial_rounds`` backward passes each, one after the other, every rank switching plans at
the same control points: the policy with the user's options; with ``fallback`` (never
slower than DDP where scheduling cannot help) DDP-style buckets (fifo); with
``autotune`` the online tuner's candidates (:mod:`gradsched.tune`, told each measured
time before it proposes the next). An arm's time is the median iteration time (forward
start to forward start) without its first round (the switch) and its last (still running
when the next arm starts). With ``autotune`` a last arm measures the fastest options so far
once more, and options are scored by the mean of their arms: the fastest of a handful of
noisy measurements is likely a lucky one. Then rank 0 keeps the policy options it started
with unless the confirmed candidate's mean beat them by ``fallback_gain``, and the buckets
unless the kept options beat them by as much; every later plan uses that choice. The
simulator's prediction of the same comparison (the measured model on the probed link, see
:mod:`gradsched.runtime.profiling`) is made at the start and reported next to the
measurement; it does not decide, because a few per cent of model error is enough to pick
the wrong side where the two are close.
"""

from __future__ import annotations

import dataclasses
import logging
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

logger = logging.getLogger("gradsched")


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
        self.chosen = policy  # the policy of later plans: the user's (tuned), or fifo after losing the trial
        self.arms = self._arms()
        self.tuning: dict[str, Any] | None = None  # the online tuner's report, once it finished
        self.switches: list[tuple[int, str]] = []  # (first round, policy) of every plan adopted here
        self.tuner = None
        if self.config.autotune and self.rank == 0 and "tune" in self.arms:
            from ..tune import Tuner, default_space
            from ..tune.space import around

            space = default_space(policy.name, self.config.autotune_space)
            start = {d.option: getattr(policy, d.option) for d in space.dimensions}  # the user's options
            # sizes stay within 8x of the starting ones unless the user gave their own ranges
            space = around(space, start, keep=tuple(self.config.autotune_space or ()))
            self.tuner = Tuner(space, seed=self.config.autotune_seed, start=start)
        self._candidate = None
        self._running: tuple[str, dict | None, Plan | None] = ("policy", {}, None)  # arm, options, plan
        self._scores: list[tuple[str, dict | None, float | None, Plan | None]] = []  # ... and median seconds
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
        for old in [r for r in self._starts if r < round_index - 2 * self.config.trial_rounds - 4]:
            del self._starts[old]

    def _arms(self) -> list[str]:
        """The measured arms that follow the first control point, the same on every rank:
        "policy" (its default options), "fifo" (DDP-style buckets, with ``fallback``),
        "tune" (a candidate of the online tuner, with ``autotune``) and "confirm" (the
        fastest options so far, measured again, with ``autotune``)."""
        arms = []
        if self.world_size > 1 and self.policy.name != "fifo" and (self.config.fallback or self.config.autotune):
            arms.append("policy")
            if self.config.fallback:
                arms.append("fifo")
            if self.config.autotune:
                arms += ["tune"] * (self.config.autotune_trials - 1) + ["confirm"]
        return arms

    @property
    def settled_round(self) -> int:
        """The first round that runs on the plan chosen after profiling and the measured
        arms (it holds until the next ``replan_every`` point)."""
        return self.config.profile_rounds + 1 + len(self.arms) * self.config.trial_rounds + 1

    def _stage(self, round_index: int) -> tuple[str, int] | None:
        """What the control point after ``round_index`` does: None (nothing), (arm, i)
        (start measured arm i), ("decide", n) (end of the n arms), ("replan", 0)."""
        first = self.config.profile_rounds + 1
        every = self.config.replan_every
        arms = self.arms
        if arms:
            k = self.config.trial_rounds
            end = first + len(arms) * k
            if first <= round_index <= end:
                i, offset = divmod(round_index - first, k)
                if offset:
                    return None
                return (arms[i], i) if i < len(arms) else ("decide", len(arms))
            first = end
        if round_index == first or (every and round_index > first and (round_index - first) % every == 0):
            return ("replan", 0)
        return None

    def control_point(self, round_index: int) -> None:
        """Called by ``optimizer.step()`` after round ``round_index`` on every rank."""
        stage = self._stage(round_index)
        if stage is None or round_index in self._done:
            return
        self._done.add(round_index)
        if stage[0] == "policy" and self.config.fallback and self.link is None and self.config.architecture == "allreduce":
            self.link = self._probe()
        proposal = [self._propose(round_index, stage) if self.rank == 0 else None]
        if self.world_size > 1:
            with failing_rank("agreeing on a new plan"):
                dist.broadcast_object_list(proposal, src=0, group=self.group)
        if proposal[0] is None:
            return
        plan, prediction, trial, tuning = proposal[0]
        self.prediction = prediction or self.prediction
        self.trial = trial or self.trial
        self.tuning = tuning or self.tuning
        if plan is not None:
            self.exchange.set_plan(plan, round_index + 1)
            self.switches.append((round_index + 1, plan.policy))

    def _iterations(self, first: int, last: int) -> list[float]:
        """Measured iteration times of rounds ``first .. last`` (forward start to forward start)."""
        return [self._starts[r + 1] - self._starts[r] for r in range(first, last + 1)
                if r in self._starts and r + 1 in self._starts]

    def _arm_time(self, i: int) -> float | None:
        """Median iteration time of arm ``i``, leaving out its first round (the switch) and
        its last (not finished when the next arm starts)."""
        start = self.config.profile_rounds + 1 + i * self.config.trial_rounds
        times = self._iterations(start + 2, start + self.config.trial_rounds - 1)
        return statistics.median(times) if times else None

    def _close_arm(self, i: int) -> None:
        """Rank 0: score arm ``i`` (the previous one) now that its rounds are measured."""
        seconds = self._arm_time(i)
        arm, options, plan = self._running
        self._scores.append((arm, options, seconds, plan))
        if self.tuner is not None and arm in ("policy", "tune") and self._candidate is not None:
            if seconds is not None:
                with torch.enable_grad():  # control points run inside optimizer.step(), under no_grad
                    self.tuner.tell(self._candidate, seconds)
                logger.info("gradsched autotune: trial %d %s: %.2f ms per iteration", self._candidate.number,
                            options, seconds * 1e3)
            self._candidate = None

    def _next_arm(self, arm: str) -> tuple[dict[str, Any] | None, Plan | None]:
        """Rank 0: the options arm ``arm`` runs with (None: fifo's defaults), and its plan
        when it re-runs one measured before (None: make one)."""
        if arm == "fifo":
            return None, None
        if arm == "confirm":
            ranked = self._ranked()
            return (dict(ranked[0]["options"]), ranked[0]["plan"]) if ranked else ({}, None)
        if self.tuner is None:
            return {}, None
        with torch.enable_grad():  # the GP sampler fits its model with autograd
            self._candidate = self.tuner.ask()
        return dict(self._candidate.options), None

    def _ranked(self) -> list[dict[str, Any]]:
        """Rank 0: the measured policy options, fastest first by the mean of their arms
        (the starting options first among equals); each with its plan as measured."""
        start = self.tuner.default_options if self.tuner is not None else {}
        groups: dict[tuple, dict[str, Any]] = {}
        for arm, options, seconds, plan in self._scores:
            if arm == "fifo" or seconds is None:
                continue
            options = dict(options or start)
            key = tuple(sorted(options.items()))
            entry = groups.setdefault(key, {"options": options, "times": [], "plan": plan,
                                            "default": options == start})
            entry["times"].append(seconds)
        for entry in groups.values():
            entry["seconds"] = statistics.fmean(entry["times"])
        return sorted(groups.values(), key=lambda e: (e["seconds"], not e["default"]))

    def _decide(self) -> tuple[Plan | None, dict | None, dict | None]:
        """Rank 0, after the last arm: the fastest measured policy options (the starting
        ones unless a candidate beat them by ``fallback_gain``), unless the buckets beat
        them by as much. Returns the plan that was measured for the choice (kept as it
        ran, not re-made from the latest estimates), and the trial and tuning reports."""
        ranked = self._ranked()
        fifo = next((entry for entry in self._scores if entry[0] == "fifo" and entry[2] is not None), None)
        if not ranked:
            return None, None, None
        gain = self.config.fallback_gain
        default = next((entry for entry in ranked if entry["default"]), None)
        # a candidate replaces the starting options only when measured twice (the confirming
        # arm) and clearly faster: one lucky arm is not enough
        best = next((entry for entry in ranked if entry["default"] or len(entry["times"]) > 1), ranked[0])
        if default is not None and best["seconds"] > default["seconds"] * (1.0 - gain):
            best = default
        options, best_s, plan = best["options"], best["seconds"], best["plan"]
        self.chosen = dataclasses.replace(self.policy, **options)
        trial = tuning = None
        if fifo is not None:
            use_fifo = best_s > fifo[2] * (1.0 - gain)
            trial = {"policy_s": best_s, "fifo_s": fifo[2], "use_fifo": use_fifo}
            if use_fifo:
                self.chosen, plan = FifoConfig(), fifo[3]
        if self.tuner is not None:
            last = self._scores[-1]
            confirm = {"options": dict(last[1]), "iteration_s": last[2]} if last[0] == "confirm" else None
            tuning = {"best_options": dict(options), "best_s": best_s, "default_s": default["seconds"] if default else None,
                      "confirm": confirm, "history": list(self.tuner.history)}
        return plan, trial, tuning

    def _propose(self, round_index: int, stage: tuple[str, int]) -> tuple | None:
        kind, i = stage
        timings = [t for t in self.timings[1:] if len(t.ready) == len(self.names)][-self.config.profile_rounds :]
        if timings:
            ready = {}
            for name in self.names:
                offsets = sorted(t.ready[name] - min(t.ready.values()) for t in timings)
                ready[name] = offsets[len(offsets) // 2]
        elif kind == "replan":  # the first round warms up; rounds with unused parameters are skipped
            return None
        else:
            ready = default_ready_times(self.tensors)
        est = self.exchange.estimator
        measured = est.ready and est.seconds_per_byte > 0
        link = (est.latency, est.seconds_per_byte, est.per_message) if measured else ()
        ps = self.config.architecture == "ps"
        if ps and link:  # a message was timed from push to pull: half of it each way
            link = tuple(x / 2 for x in link)
        prediction = trial = tuning = None
        if kind == "policy" and not ps and measured and timings and self.config.fallback:
            # reported next to the measured trial: the simulator's view of the same choice,
            # on the probed link (training messages also wait for the slowest rank to join)
            prediction = self._predict(timings, *(self.link or (est.latency, est.seconds_per_byte, est.per_message)))
        if kind not in ("replan", "policy"):
            self._close_arm(i - 1)
        plan = options = None
        if kind == "decide":
            plan, trial, tuning = self._decide()
            policy = self.chosen
        elif kind == "replan":
            policy = self.chosen
        else:
            options, plan = self._next_arm(kind)
            policy = FifoConfig() if options is None else dataclasses.replace(self.policy, **options)
        if plan is None:
            plan = make_plan(self.tensors, ready, policy, *link, arch=self.config.architecture)
        if kind not in ("decide", "replan"):
            self._running = (kind, options, plan)
        current = self.exchange.plan_for(round_index + 1)
        if plan.messages == current.messages and plan.cross_barrier == current.cross_barrier:
            return None, prediction, trial, tuning
        return plan, prediction, trial, tuning

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
