"""Control points: where every rank adopts the plan rank 0 made from its measurements.

This is the one runtime module that uses the simulator: it makes plans
(:func:`gradsched.sim.make_plan`) and predictions (:mod:`gradsched.sim.predict`).

At the rounds the :class:`~gradsched.control.ControlSchedule` names, rank 0 makes a plan
from the median ready times of the latest rounds and the link estimate. One broadcast
carries it to every rank, always at the same point after a round (``optimizer.step()``; the
next training forward pass where no step followed; inside ``join()``, the next iteration's
announcement, see :mod:`gradsched.runtime.training.join`), and the plan
takes effect from the next round on. After profiling, rank 0 runs the measured-arms
experiment (:class:`~gradsched.control.ArmsExperiment`: the policy against DDP-style
buckets, and the online tuner's candidates): it asks for each arm, makes (or re-uses) its
plan, and tells it the arm's measured iteration times (forward start to forward start);
then it adopts what the experiment decides. The simulator's prediction of the same
comparison (the measured model on a probed link, see :mod:`gradsched.runtime.planning.profiling`) is
made at the start and reported next to the measurement; it does not decide, because a few
per cent of model error is enough to pick the wrong side where the two are close.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from functools import partial
import logging
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from gradsched.control import Arm, ArmKind, ArmsExperiment, ControlPoint, ControlSchedule, Stage
from gradsched.control.arms import SLOWER_MARGIN, arm_kinds
from gradsched.control.ranks import BURST_WINDOW, LINK_WINDOW, RanksReport, compare_ranks
from gradsched.core.base import PolicyConfig
from gradsched.core.engine import message_hold
from gradsched.core.estimator import MeasuredLink
from gradsched.core.gathers import GatherModel
from gradsched.core.plan import Plan
from gradsched.runtime.comm.compression import wire_dtype
from gradsched.core.task import TensorSpec
from gradsched.sim import default_ready_times, paced_ready_times, make_plan
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.errors import failing_rank
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.planning.link_model import LinkModel
from gradsched.runtime.planning.measurements import Measurements
from gradsched.runtime.planning.probe import probe_link, probe_ring
from gradsched.runtime.planning.clock import Clock
from gradsched.runtime.planning.prediction import TrialPredictor
from gradsched.runtime.planning.profiling import RoundTiming
from gradsched.runtime.comm import wire_format
from gradsched.runtime.comm.wire_format import Proposal, RankTiming
from gradsched.runtime.diagnostics.tracing import RunTrace

logger = logging.getLogger("gradsched")


def initial_plan(tensors: Sequence[TensorSpec], policy: PolicyConfig, arch: str, hold_bytes: int | None) -> Plan:
    """The plan before anything is measured: gradients guessed ready in reverse order (under a
    memory budget, at the link's pace: sent as they come, nothing reordered to hold them)."""
    ready = default_ready_times(tensors) if hold_bytes is None else paced_ready_times(tensors)
    unmeasured = policy.for_link(sum(t.nbytes for t in tensors), 0.0, 0.0, 0.0)  # sizes for a link not yet measured
    return make_plan(tensors, ready, unmeasured, arch=arch, hold_bytes=hold_bytes)


class Planner:
    def __init__(self, tensors: Sequence[TensorSpec], params: Sequence[torch.Tensor], policy: PolicyConfig,
                 config: RuntimeConfig, link_model: LinkModel, owners: dict[str, list[str]], exchange: Exchange,
                 group: dist.ProcessGroup, rank: int, world_size: int,
                 probe_group: dist.ProcessGroup | None = None, clock: Clock | None = None,
                 settle: Callable[[], None] | None = None, measured: Measurements | None = None,
                 gathers: Callable[[], GatherModel | None] | None = None, trace: RunTrace | None = None,
                 ranks_per_host: int = 1) -> None:
        self.tensors = list(tensors)
        self.names = [t.name for t in self.tensors]
        self.sizes = {t.name: (p.numel(), p.element_size()) for t, p in zip(self.tensors, params)}
        self.total_bytes = sum(t.nbytes for t in self.tensors)  # what sizes derived from the link follow
        self.device = params[0].device
        self.policy = policy
        self.config = config
        self.link_model = link_model  # how plans model the architecture's link
        self.owners = owners  # module -> the parameters its forward waits for
        self.exchange = exchange
        self.group = group  # gloo, every worker: plans
        self.probe_group = probe_group or group  # the link to probe: the data group (on the launcher's thread)
        self.rank = rank
        self.world_size = world_size
        self.settle = settle  # waits until no gradient is in flight
        self.gathers = gathers  # what else the backward pass puts on the link (fully sharded's gathers)
        self.kept_buckets = False  # every rank: the measured trial kept the DDP-style buckets
        self.clock = clock or Clock()  # the training thread's (device times on CUDA)
        self.predictor = TrialPredictor(self.tensors, self.sizes, owners, policy, config, link_model,
                                        world_size, exchange)
        compare = world_size > 1 and not policy.is_buckets
        kinds = (arm_kinds(config.fallback, config.autotune_trials if config.autotune else 0, config.trial_pairs)
                 if compare else ())
        self.schedule = ControlSchedule(config.profile_rounds, config.trial_rounds, config.replan_every, len(kinds))
        self._kinds = kinds if rank == 0 else ()
        self.experiment: ArmsExperiment | None = None  # rank 0, from the first arm on (when the link is measured)
        self.chosen = policy  # the policy of later plans: the user's (tuned), or fifo after losing the trial
        self.link: MeasuredLink | None = None  # probed once, before the measured trial
        # what it measures and decides, kept by the run (stats(), export_profile()): the timings, the
        # prediction, the trial, the tuning, the switches
        self.measured = measured if measured is not None else Measurements()
        self.measured.owners, self.measured.sizes = owners, self.sizes
        self.measured.settled_round = self.schedule.settled_round
        self._running: tuple[Arm, Plan] | None = None  # rank 0: the arm being measured, and its plan
        self._starts: dict[int, RoundTiming] = {}  # round -> its timing (the forward start before its backward)
        self._done: set[int] = set()
        self.trace = trace
        self._slow_ready: list[float] | None = None  # the slow rank's ready times, which rank 0 plans on
        # this rank's latest rounds, for bursts (gradsched.control.ranks): recorded, then each one's
        # backward pass once resolved at a control point
        self._unresolved: deque[RoundTiming] = deque(maxlen=BURST_WINDOW)
        self._spans: deque[float] = deque(maxlen=BURST_WINDOW)
        self._recorded = 0
        # this rank's ring probes (3+ ranks), one at every control point: whose link is slow, steadily or in bursts
        self._link_probes: deque[float] = deque(maxlen=LINK_WINDOW)
        # the ranks on this rank's host: where every host has as many (consecutive ranks), the links judged are
        # the hosts' (a transfer within a host crosses none); where they differ no link is named (nor probed after
        # the first exchange says so)
        self.ranks_per_host = ranks_per_host
        self._uneven_hosts = False

    def _experiment(self, kinds: Sequence[ArmKind]) -> ArmsExperiment:
        tuner = None
        if ArmKind.CANDIDATE in kinds:
            from gradsched.tune import Tuner, default_space
            from gradsched.tune.space import around

            space = default_space(self.policy.name, self.config.autotune_space)
            # the user's options, with those the policy derives from the link as it derives them now
            own = self._sized(self.policy)
            start = {d.option: getattr(own, d.option) for d in space.dimensions}
            # sizes stay within 8x of the starting ones unless the user gave their own ranges
            space = around(space, start, keep=tuple(self.config.autotune_space or ()))
            tuner = Tuner(space, seed=self.config.autotune_seed, start=start)
        return ArmsExperiment(kinds, tuner.default_options if tuner else {}, self.config.fallback_gain, tuner,
                              extra_pairs=self.config.trial_extra_pairs)

    def _sized(self, policy: PolicyConfig) -> PolicyConfig:
        """``policy`` with the sizes it derives from the link derived (see ``PolicyConfig.for_link``):
        from the link probed before the trial; else from the estimate of the messages timed so
        far where it tells per-message from per-byte costs; else as for a link not yet measured.
        (With every message about one size the estimate puts all the cost per byte, and a
        per-message cost of 0 would cut the slices to the smallest.)"""
        total = self.total_bytes
        if self.link is not None and self.link.seconds_per_byte > 0:
            return policy.for_link(total, *self.link_model.link(self.link.latency_s, self.link.seconds_per_byte,
                                                                  self.link.overhead_s))
        link = self.predictor.estimated_link()
        if link and self.exchange.estimator.separable:
            return policy.for_link(total, *link)
        return policy.for_link(total, 0.0, 0.0, 0.0)

    def adopt(self, param: str, module: str) -> None:
        """``module`` (which runs) waits for ``param`` instead of the module that holds it."""
        for names in self.owners.values():
            if param in names:
                names.remove(param)
        self.owners.setdefault(module, []).append(param)

    def record(self, timing: RoundTiming, round_index: int) -> None:
        measured = self.measured
        measured.timings = (measured.timings + [timing])[-(self.config.profile_rounds + 1) :]
        self._recorded += 1
        if self._recorded > 1 and self.world_size > 1:  # the first round warms up; one rank compares with none
            self._unresolved.append(timing)
        self._starts[round_index] = timing
        for old in [r for r in self._starts if r < round_index - 2 * self.config.trial_rounds - 4]:
            del self._starts[old]

    def close(self) -> None:
        self.group = self.probe_group = None

    # -- every rank ----------------------------------------------------------------------------
    def control_point(self, round_index: int) -> None:
        """Called after round ``round_index`` on every rank at the same point (once: later calls
        for the same round do nothing)."""
        point = self.schedule.at(round_index)
        if point is None or round_index in self._done:
            return
        self._done.add(round_index)
        with _users_random_state_kept(self.device):  # the tuner's sampler and the probe draw nothing of the user's
            self._control_point(round_index, point)

    def _control_point(self, round_index: int, point: ControlPoint) -> None:
        if point.stage in (Stage.ARM, Stage.DECIDE):
            self.clock.fence()  # what the arm before queued on the device runs before the next is timed
        first_arm = point == ControlPoint(Stage.ARM, 0)
        # the link is probed where the simulator models it (all-reduce), for the trial's prediction
        # or for the sizes a policy derives from it; the same on every rank
        probing = self.link_model.probed and (self.config.fallback or self.policy.derived)
        if first_arm and probing and self.link is None:
            if self.settle:
                self.settle()
            with failing_rank("measuring the link", self.exchange.explain):
                probe = partial(probe_link, self.probe_group, self.device, wire=wire_dtype(self.config.compression))
                self.link = self.exchange.between_rounds(  # after what the data group queued (emulated NCCL)
                    partial(self.exchange.device.run, self.probe_group, probe))
        if self.world_size >= 3 and not self._uneven_hosts:
            self._probe_ring()
        if self.world_size > 1:
            self._compare_ranks()
        proposal = (self._propose(round_index, point) or Proposal(None)) if self.rank == 0 else None
        if self.world_size > 1:
            with failing_rank("agreeing on a new plan", self.exchange.explain):
                proposal = wire_format.broadcast("proposal", proposal, 0, self.group)
        if proposal.plan is not None:
            wire_format.check_plan(proposal.plan, self.tensors, "rank 0")
        self._adopt(proposal, round_index + 1)

    def _probe_ring(self) -> None:
        """Time this rank's link, the link idle: a transfer to the next rank of the data group's
        ring (gradsched.control.ranks.slow_link), kept with the latest ones; only where the data
        group is the workers (a group that also holds servers has other ranks)."""
        group = self.probe_group
        if dist.get_world_size(group) != self.world_size or dist.get_rank(group) != self.rank:
            return
        if self.settle:
            self.settle()
        with failing_rank("timing each rank's link", self.exchange.explain):
            self._link_probes.append(self.exchange.between_rounds(
                partial(self.exchange.device.run, group, partial(probe_ring, group, self.device))))

    def _compare_ranks(self) -> None:
        """Every rank's backward pass and ready times, exchanged (every rank, at every control
        point): which rank is slow (gradsched.control.ranks), said when that changes; rank 0
        plans on the slow rank's ready times while there is one."""
        timings = self._complete_timings()
        ready = list(_median_ready(timings, self.names).values()) if timings else []
        while self._unresolved:
            span = _backward_span(self.clock.resolve(self._unresolved.popleft()), len(self.names))
            if span is not None:
                self._spans.append(span)
        mine = RankTiming(_median_backward(timings), ready, list(self._spans), list(self._link_probes),
                          self.ranks_per_host)
        with failing_rank("comparing the ranks' timings", self.exchange.explain):
            ranks = wire_format.all_gather("rank_timing", mine, self.group)
        per_host = {r.ranks_per_host for r in ranks}  # alike on every rank: they all gathered it
        self._uneven_hosts = len(per_host) > 1 or self.world_size % max(per_host) != 0
        links = [r.link_probes for r in ranks] if self._link_probes and not self._uneven_hosts else None
        report = compare_ranks([r.backward_s for r in ranks], [r.spans for r in ranks], links, max(per_host))
        if report is None:
            return
        before, self.measured.ranks = self.measured.ranks, report
        slow = report.slow_rank
        self._slow_ready = ranks[slow].ready if slow is not None and len(ranks[slow].ready) == len(self.names) else None
        if (before.verdict if before is not None else (None,) * len(report.verdict)) != report.verdict:
            if self.rank == 0:
                logger.log(logging.WARNING if report.named else logging.INFO, "gradsched: %s", report.describe())
            if self.trace is not None:
                said = [f"slow rank {slow} ({report.ratio:.2f}x)"] if slow is not None else []
                if report.burst_rank is not None:
                    said.append(f"rank {report.burst_rank} slow in bursts ({report.burst_rounds} of "
                                f"{report.burst_of}, up to {report.burst_ratio:.2f}x)")
                if report.link_rank is not None:
                    said.append(f"{report.whose_link(report.link_rank)} slow ({report.link_ratio:.2f}x)")
                if report.link_burst_rank is not None:
                    said.append(f"{report.whose_link(report.link_burst_rank)} slow in bursts ({report.link_burst_probes} "
                                f"of {report.link_probes_of} probes, up to {report.link_burst_ratio:.2f}x)")
                self.trace.mark("ranks", "; ".join(said) or "no slow rank",
                                {"backward_ms": [None if s is None else s * 1e3 for s in report.backward_s]})

    def _adopt(self, proposal: Proposal, first_round: int) -> None:
        measured = self.measured
        if proposal.more_pairs:
            self.schedule = self.schedule.with_arms(self.schedule.arms + 2 * proposal.more_pairs)
            measured.settled_round = self.schedule.settled_round
        measured.prediction = proposal.prediction or measured.prediction
        measured.trial = proposal.trial or measured.trial
        self.kept_buckets |= proposal.trial is not None and proposal.trial.use_fifo
        measured.tuning = proposal.tuning or measured.tuning
        previous = measured.switches[-1][1] if measured.switches else None
        if proposal.plan is not None:
            self.exchange.set_plan(proposal.plan, first_round)
            measured.adopt(proposal.plan, first_round)
            measured.switches.append((first_round, proposal.plan.policy))
        if self.rank == 0:  # every rank adopts the same: said once
            self._say(proposal, first_round, previous)

    def _say(self, proposal: Proposal, first_round: int, previous: str | None) -> None:
        """What was decided, on the ``gradsched`` logger: the trial's choice and what online
        tuning kept at INFO every time (also where the plan stays as it was: the buckets kept
        as the last arm measured), changes of policy at INFO, routine re-plans at DEBUG."""
        plan = proposal.plan
        if proposal.more_pairs:
            logger.info("gradsched: measured trial: the pairs so far cannot tell %s from DDP-style buckets; measuring "
                        "%d pair(s) more", self.policy.name, proposal.more_pairs)
        if proposal.trial is not None:
            trial = proposal.trial
            pairs = ", ".join(f"{p * 1e3:.1f}/{b * 1e3:.1f}" for p, b in trial.pairs)
            logger.info("gradsched: measured trial: %s %.2f ms, DDP-style buckets %.2f ms per iteration: %s, %s%s",
                        self.policy.name, trial.policy_s * 1e3, trial.fifo_s * 1e3,
                        "keeping the buckets" if trial.use_fifo else f"keeping {self.policy.name}",
                        {"measured": "by measurement",
                         "pooled": "by measurement (the pooled mean of the pairs, beyond its noise)",
                         "slower": f"by measurement (every pair slower by more than {SLOWER_MARGIN:.0%} past "
                                   "the threshold, inside its noise or not)",
                         "prior": "inside the noise: as the simulator predicts",
                         "mean": "inside the noise: by the mean of the pairs"}[trial.by],
                        f" (pairs, {self.policy.name}/buckets ms: {pairs})" if pairs else "")
        if proposal.tuning is not None:
            tuning = proposal.tuning
            default = f"{tuning.default_s * 1e3:.2f} ms" if tuning.default_s is not None else "not measured"
            logger.info("gradsched: online tuning kept %s (%.2f ms per iteration; the starting options: %s)",
                        tuning.best_options, tuning.best_s * 1e3, default)
        if plan is None:
            return
        level = logging.INFO if plan.policy != previous else logging.DEBUG
        logger.log(level, "gradsched: from backward pass %d on: a %s plan of %d messages",
                   first_round, plan.policy, len(plan.messages))

    def _complete_timings(self) -> list[RoundTiming]:
        """The latest measured rounds (the first one warms up) in which every parameter got a gradient."""
        return self.measured.complete_timings(self.clock, self.config.profile_rounds)

    # -- rank 0 ---------------------------------------------------------------------------------
    def _propose(self, round_index: int, point: ControlPoint) -> Proposal | None:
        timings = self._complete_timings()
        if not timings and point.stage == Stage.REPLAN:  # the first round warms up; rounds with unused
            return None  # parameters are skipped
        ready = _median_ready(timings, self.names) if timings else default_ready_times(self.tensors)
        self.measured.planned_on = self.rank
        if self._slow_ready is not None and self.config.plan_on_slow_rank:  # every collective waits for the slow
            # rank: its gaps are the ones to fill
            ready = dict(zip(self.names, self._slow_ready))
            self.measured.planned_on = self.measured.ranks.slow_rank
        link = self.predictor.estimated_link()
        prediction = self.predictor.prediction(timings, link, self.link) if point == ControlPoint(Stage.ARM, 0) else None
        arm = decision = None
        if point.stage == Stage.DECIDE or (point.stage == Stage.ARM and point.index > 0):
            self._close_arm()
        if self.experiment is None and self._kinds and point.stage != Stage.REPLAN:
            self.experiment = self._experiment(self._kinds)
        more = int(point.stage == Stage.DECIDE and self.experiment.more())  # the pairs cannot tell: a pair more
        if point.stage == Stage.ARM or more:
            with torch.enable_grad():  # the GP sampler fits its model with autograd (step() runs under no_grad)
                arm = self.experiment.ask()
            policy, plan = self._with(arm.options), arm.plan
        elif point.stage == Stage.DECIDE:
            prediction = self.measured.prediction
            prior = None if prediction is None else not prediction.use_fifo
            decision = self.experiment.decide(prior)
            if decision is not None:
                self.chosen = self._with(decision.options)
            policy, plan = self.chosen, decision and decision.plan
        else:
            policy, plan = self.chosen, None
        plan = plan or make_plan(self.tensors, ready, self._sized(policy), *link, arch=self.link_model.sim,
                                 servers=max(1, self.link_model.servers),
                                 hold_bytes=message_hold(self.exchange.hold_bytes),
                                 gathers=self.gathers() if self.gathers is not None and timings else None)
        if arm is not None:
            self._running = (arm, plan)
        changed = not plan.same_schedule(self.exchange.plan_for(round_index + 1))
        return Proposal(plan if changed else None, prediction, decision and decision.trial,
                        decision and decision.tuning, more)

    def _with(self, options: dict | None) -> PolicyConfig:
        """The policy with ``options`` (None: DDP-style buckets)."""
        return self.predictor.buckets() if options is None else dataclasses.replace(self.policy, **options)

    def _close_arm(self) -> None:
        """Tell the experiment the measured iteration times of the arm that just ended."""
        arm, plan = self._running
        first, last = self.schedule.measured_rounds(arm.index)
        times = [self.clock.between(self._starts[r], self._starts[r + 1]) for r in range(first, last + 1)
                 if r in self._starts and r + 1 in self._starts]
        with torch.enable_grad():
            seconds = self.experiment.tell(arm, times, plan)
        if seconds is not None:
            logger.info("gradsched: arm %d (%s) %s: %.2f ms per iteration", arm.index, arm.kind.value,
                        arm.options if arm.options is not None else "DDP-style buckets", seconds * 1e3)


def _users_random_state_kept(device: torch.device):
    """Whatever runs inside (Optuna's samplers fit with torch) leaves the user's generators
    (the CPU one, and the parameters' CUDA device's) as they were."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type="cuda")


def _backward_span(timing: RoundTiming, tensors: int | None = None) -> float | None:
    """A round's backward pass (the end of its forward pass to its last gradient: nothing of
    another rank's delays it); None where it has none, or fewer than ``tensors`` gradients."""
    if not timing.ready or not timing.forward_end or (tensors is not None and len(timing.ready) != tensors):
        return None
    return max(timing.ready.values()) - timing.forward_end


def _median_backward(timings: Sequence[RoundTiming]) -> float | None:
    """The backward pass, the median over ``timings`` (the upper one of an even count); None without."""
    spans = sorted(span for t in timings if (span := _backward_span(t)) is not None)
    return spans[len(spans) // 2] if spans else None


def _median_ready(timings: Sequence[RoundTiming], names: Sequence[str]) -> dict[str, float]:
    """Each gradient's ready time (from the first gradient of its round), the median over
    ``timings`` (the upper one of an even count)."""
    ready = {}
    for name in names:
        offsets = sorted(t.ready[name] - min(t.ready.values()) for t in timings)
        ready[name] = offsets[len(offsets) // 2]
    return ready
