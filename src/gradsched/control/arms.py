"""The measured-arms experiment: which plan runs in each arm, and which one is kept.

After profiling, the runtime measures *arms* one after the other, each a few rounds on one
plan, every rank switching plans at the same control points
(:mod:`gradsched.control.schedule`):

* ``POLICY``: the policy with the starting options (the user's);
* ``BUCKETS``: DDP-style buckets (``fifo``), with ``fallback``: where scheduling cannot
  help, the run keeps what DDP does (at the cost of gradsched's Python launcher against
  DDP's C++ reducer: 3-5% on loopback, docs/bench.md);
* ``CANDIDATE``: options proposed by the online tuner (:class:`gradsched.tune.Tuner`),
  told every measured time before it proposes the next, with ``autotune``;
* ``CONFIRM``: the fastest options so far, measured again, with ``autotune``: the fastest
  of a handful of noisy measurements is likely a lucky one.

An arm's time is the median of its measured iteration times. Options are scored by the
mean of their arms. The decision keeps the starting options unless a candidate measured
twice (its arm and the confirming one) beat them by ``gain`` on that mean, and the
buckets unless the kept options beat them by as much. The policy and the buckets run in
interleaved pairs (``pairs``), and a pair counts only where the difference is larger than
its noise; where no side wins in every pair, more pairs are measured, one at a time up to
``extra_pairs`` (:meth:`ArmsExperiment.more`), until the pooled mean of all pairs is beyond
its noise; where even that cannot tell, the simulator's prediction decides
(:meth:`ArmsExperiment.decide`), so noise on a loaded host cannot flip a clear gain, except
that a policy every pair measured slower than the threshold by more than
:data:`SLOWER_MARGIN` is never kept, however noisy the pairs: the prediction assumes what the
measurement contradicts (on a host where compute and communication share the cores, that
they overlap for free).

Rank 0 runs the experiment with an ask/tell loop; it holds no clock, no thread and no
torch, so exact sequences of measured times can be checked without processes:

>>> experiment = ArmsExperiment(arm_kinds(fallback=True), start={}, gain=0.02)
>>> policy = experiment.ask(); policy.kind, policy.options
(<ArmKind.POLICY: 'policy'>, {})
>>> experiment.tell(policy, [0.30, 0.31, 0.30], plan="policy plan")
0.3
>>> buckets = experiment.ask(); buckets.kind, buckets.options
(<ArmKind.BUCKETS: 'fifo'>, None)
>>> experiment.tell(buckets, [0.33, 0.32], plan="bucket plan")
0.325
>>> decision = experiment.decide()
>>> decision.options, decision.plan, decision.trial
({}, 'policy plan', TrialReport(policy_s=0.3, fifo_s=0.325, use_fifo=False, pairs=((0.3, 0.325),), by='measured'))
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence


#: how far above the threshold (``1 - gain``) every pair's ratio of the policy's time to the
#: buckets' must be for the buckets to be kept whatever the noise says
SLOWER_MARGIN = 0.05


class ArmKind(enum.Enum):
    POLICY = "policy"  # the policy with the starting options
    BUCKETS = "fifo"  # DDP-style buckets
    CANDIDATE = "tune"  # a candidate of the online tuner
    CONFIRM = "confirm"  # the fastest options so far, again


def arm_kinds(fallback: bool, autotune_trials: int = 0, pairs: int = 1) -> tuple[ArmKind, ...]:
    """The arms, in order: the policy, the buckets (with ``fallback``: ``pairs`` times, the
    two interleaved), and with ``autotune_trials`` > 0 that many tuner candidates (the
    policy's first arm is the first) followed by a confirming arm. No arm at all when there
    is nothing to compare."""
    if not fallback and not autotune_trials:
        return ()
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    kinds = [ArmKind.POLICY, ArmKind.BUCKETS] * pairs if fallback else [ArmKind.POLICY]
    if autotune_trials:
        kinds += [ArmKind.CANDIDATE] * (autotune_trials - 1) + [ArmKind.CONFIRM]
    return tuple(kinds)


@dataclass(frozen=True)
class Arm:
    index: int
    kind: ArmKind
    options: dict[str, Any] | None  # the policy's options to run with; None: DDP-style buckets
    plan: Any = None  # a plan measured before for these options, to run again as it ran


@dataclass(frozen=True)
class TrialReport:
    """The measured comparison of the kept options with DDP-style buckets."""

    policy_s: float
    fifo_s: float
    use_fifo: bool
    pairs: tuple[tuple[float, float], ...] = ()  # (policy, buckets) of each interleaved pair of arms
    by: str = "measured"  # what decided: "measured"; "slower", every pair slower than the threshold by
    #   more than SLOWER_MARGIN, inside its noise or not; "pooled", the pooled mean of the pairs (extra pairs
    #   measured) beyond its noise; "prior", the simulator's prediction, where every
    #   pair was inside the noise or the pairs disagreed; "mean" of the pairs there, without a prediction


@dataclass(frozen=True)
class TuningReport:
    """What the online tuner found."""

    best_options: dict[str, Any]  # kept (the starting options unless a candidate was confirmed faster)
    best_s: float  # mean of the kept options' arms
    default_s: float | None  # mean of the starting options' arms
    confirm: dict[str, Any] | None  # {"options", "iteration_s"} of the confirming arm
    history: list[dict[str, Any]]  # the tuner's history, one entry per candidate


@dataclass(frozen=True)
class Decision:
    options: dict[str, Any] | None  # the policy's options to keep; None: DDP-style buckets
    plan: Any  # the plan measured for them, to keep as it ran
    trial: TrialReport | None  # with fallback
    tuning: TuningReport | None  # with a tuner


class Proposer(Protocol):
    """What the experiment needs of a tuner (:class:`gradsched.tune.Tuner` is one)."""

    history: list[dict[str, Any]]

    def ask(self) -> Any:  # a candidate with ``.options``
        ...

    def tell(self, candidate: Any, iteration_s: float) -> None:
        ...


@dataclass
class _Score:
    kind: ArmKind
    options: dict[str, Any] | None
    seconds: float | None
    plan: Any
    times: tuple[float, ...] = ()


@dataclass
class _Ranked:
    options: dict[str, Any]
    start: bool  # the starting options
    plan: Any
    times: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return statistics.fmean(self.times)


class ArmsExperiment:
    """Ask for the next arm, run it, tell its measured iteration times; then decide.

    ``start``: the starting options (with a tuner, its own starting options, which are its
    first candidate). ``gain``: how much faster (a fraction) options must be to replace
    the starting ones, and the kept ones to replace the buckets."""

    def __init__(self, kinds: Sequence[ArmKind], start: Mapping[str, Any], gain: float,
                 tuner: Proposer | None = None, extra_pairs: int = 0) -> None:
        if not kinds:
            raise ValueError("an experiment needs at least one arm")
        if not gain < 1.0:
            raise ValueError(f"gain must be < 1, got {gain}")
        if ArmKind.CANDIDATE in kinds and tuner is None:
            raise ValueError("candidate arms need a tuner")
        if extra_pairs < 0:
            raise ValueError(f"extra_pairs must be >= 0, got {extra_pairs}")
        self.kinds = tuple(kinds)
        #: pairs of arms (the policy, then the buckets) that may still be added where the pairs
        #: measured so far cannot tell the two apart (:meth:`more`)
        self.extra_pairs = extra_pairs if ArmKind.BUCKETS in kinds else 0
        self._base_pairs = sum(k == ArmKind.BUCKETS for k in kinds)
        self.start = dict(start)
        self.gain = gain
        self.tuner = tuner
        self.scores: list[_Score] = []
        self._asked: Arm | None = None
        self._candidate: Any = None

    @property
    def done(self) -> bool:
        """Every arm was asked for and told."""
        return len(self.scores) == len(self.kinds)

    def ask(self) -> Arm:
        """The next arm (after the previous one was told)."""
        if self._asked is not None:
            raise RuntimeError(f"arm {self._asked.index} was asked for and not told yet")
        if self.done:
            raise RuntimeError("every arm has been measured: decide()")
        index = len(self.scores)
        kind = self.kinds[index]
        plan = None
        earlier = self._first(kind) if kind in (ArmKind.POLICY, ArmKind.BUCKETS) else None
        if earlier is not None:  # the policy or the buckets again, on the plan their first arm ran
            options, plan = None if earlier.options is None else dict(earlier.options), earlier.plan
        elif kind == ArmKind.BUCKETS:
            options = None
        elif kind == ArmKind.CONFIRM:
            ranked = self.ranked()
            options, plan = (dict(ranked[0].options), ranked[0].plan) if ranked else (dict(self.start), None)
        elif self.tuner is not None:
            self._candidate = self.tuner.ask()
            options = dict(self._candidate.options)
        else:
            options = dict(self.start)
        self._asked = Arm(index, kind, options, plan)
        return self._asked

    def tell(self, arm: Arm, iteration_times: Sequence[float], plan: Any) -> float | None:
        """Report the measured iteration times of ``arm`` (the plan it ran on); returns the
        arm's time, their median (None when nothing was measured)."""
        if arm is not self._asked:
            raise ValueError(f"arm {arm.index} is not the arm asked for")
        self._asked = None
        seconds = statistics.median(iteration_times) if iteration_times else None
        self.scores.append(_Score(arm.kind, arm.options, seconds, plan, tuple(iteration_times)))
        if self._candidate is not None:
            if seconds is not None:
                self.tuner.tell(self._candidate, seconds)
            self._candidate = None
        return seconds

    def more(self) -> bool:
        """Once every arm is measured: whether to measure another pair first, because the
        pairs so far cannot tell the policy from the buckets (they fall inside their noise or
        disagree, and their pooled mean cannot tell either) and the budget of extra pairs
        allows one. If so, the pair is added to the arms (ask for them as before) and the
        budget shrinks by one; :meth:`decide` comes after them."""
        if not self.done or self.extra_pairs <= 0:
            return False
        ranked = self.ranked()
        if not ranked or not self._kept(ranked, next((e for e in ranked if e.start), None)).start:
            return False  # options a tuner found are compared by their means, not by pairs
        if self._by_measurement(self._pairs()) is not None:
            return False
        self.extra_pairs -= 1
        self.kinds += (ArmKind.POLICY, ArmKind.BUCKETS)
        return True

    def _kept(self, ranked: Sequence[_Ranked], start: _Ranked | None) -> _Ranked:
        """The options kept among ``ranked`` (not empty): a candidate replaces the starting
        options only when measured twice (the confirming arm) and clearly faster, by the gain:
        one lucky arm is not enough."""
        best = next((entry for entry in ranked if entry.start or len(entry.times) > 1), ranked[0])
        return start if start is not None and best.seconds > start.seconds * (1.0 - self.gain) else best

    def _pairs(self) -> list[tuple[_Score, _Score]]:
        """Each measured policy arm with the buckets' arm right after it."""
        return [(p, b) for p, b in zip(self.scores, self.scores[1:])
                if p.kind == ArmKind.POLICY and b.kind == ArmKind.BUCKETS and None not in (p.seconds, b.seconds)]

    def _by_measurement(self, pairs: Sequence[tuple[_Score, _Score]]) -> tuple[bool, str] | None:
        """(use the buckets, how) where the pairs decide it: every pair the same way beyond its
        noise; every pair slower than the threshold by more than :data:`SLOWER_MARGIN`; or,
        once more pairs than the first were measured, their pooled mean beyond its noise.
        None: they cannot tell."""
        if not pairs:
            return None
        threshold = 1.0 - self.gain
        ratios = [(p.seconds / b.seconds, p.seconds / b.seconds * ratio_noise(p.times, b.times)) for p, b in pairs]
        if all(ratio + noise <= threshold for ratio, noise in ratios):
            return False, "measured"
        if all(ratio - noise > threshold for ratio, noise in ratios):
            return True, "measured"
        if all(ratio > threshold + SLOWER_MARGIN for ratio, _ in ratios):
            return True, "slower"
        if len(ratios) > self._base_pairs:
            mean, noise = pooled(ratios)
            if mean + noise <= threshold or mean - noise > threshold:
                return mean > threshold, "pooled"
        return None

    def _first(self, kind: ArmKind) -> _Score | None:
        return next((score for score in self.scores if score.kind == kind), None)

    def ranked(self) -> list[_Ranked]:
        """The measured policy options, fastest first by the mean of their arms (the
        starting options first among equals); each with its plan as first measured."""
        groups: dict[tuple, _Ranked] = {}
        for score in self.scores:
            if score.kind == ArmKind.BUCKETS or score.seconds is None:
                continue
            key = tuple(sorted(score.options.items()))
            entry = groups.setdefault(key, _Ranked(dict(score.options), score.options == self.start, score.plan))
            entry.times.append(score.seconds)
        return sorted(groups.values(), key=lambda e: (e.seconds, not e.start))

    def decide(self, prior: bool | None = None) -> Decision | None:
        """The options to keep and the plan measured for them (None: nothing was measured).

        ``prior``: whether the simulator predicts the policy clearly faster than the
        buckets (None: no prediction); it decides the trial only where the measurement
        cannot (:meth:`_trial`)."""
        ranked = self.ranked()
        if not ranked:
            return None
        start = next((entry for entry in ranked if entry.start), None)
        best = self._kept(ranked, start)
        options, plan = best.options, best.plan
        trial = self._trial(best, prior)
        if trial is not None and trial.use_fifo:
            options, plan = None, self._first(ArmKind.BUCKETS).plan
        return Decision(options, plan, trial, self._tuning(best, start))

    def _trial(self, best: _Ranked, prior: bool | None) -> TrialReport | None:
        """The kept options against the buckets.

        The starting options are compared pair by pair: each policy arm with the buckets' arm
        right after it, so a drift of the host's speed falls on both sides of a pair. A pair
        speaks only where its ratio is farther from the threshold (``1 - gain``) than its
        noise (the standard error of the ratio of the two medians); the policy is kept if every
        pair says it is faster by the gain, the buckets if every pair says it is not, or if
        every pair measured it slower than the threshold by more than :data:`SLOWER_MARGIN`.
        Otherwise the measurement cannot tell, and the simulator's prediction decides (the
        mean of the pairs without one). Options a tuner found are compared by the means of their arms."""
        buckets = [s for s in self.scores if s.kind == ArmKind.BUCKETS and s.seconds is not None]
        if not buckets:
            return None
        threshold = 1.0 - self.gain
        fifo_s = statistics.fmean(s.seconds for s in buckets)
        pairs = self._pairs()
        if not (best.start and pairs):
            return TrialReport(best.seconds, fifo_s, best.seconds > fifo_s * threshold)
        seconds = tuple((p.seconds, b.seconds) for p, b in pairs)
        policy_s = statistics.fmean(p.seconds for p, _ in pairs)
        fifo_s = statistics.fmean(b.seconds for _, b in pairs)
        measured = self._by_measurement(pairs)
        if measured is not None:
            return TrialReport(policy_s, fifo_s, measured[0], seconds, by=measured[1])
        if prior is not None:
            return TrialReport(policy_s, fifo_s, not prior, seconds, by="prior")
        mean = statistics.fmean(p.seconds / b.seconds for p, b in pairs)
        return TrialReport(policy_s, fifo_s, mean > threshold, seconds, by="mean")

    def _tuning(self, best: _Ranked, start: _Ranked | None) -> TuningReport | None:
        if self.tuner is None:
            return None
        last = self.scores[-1]
        confirm = ({"options": dict(last.options), "iteration_s": last.seconds}
                   if last.kind == ArmKind.CONFIRM else None)
        return TuningReport(dict(best.options), best.seconds, start.seconds if start else None, confirm,
                            list(self.tuner.history))


def median_error(times: Sequence[float]) -> float:
    """The standard error of the median of ``times``, relative to it: 1.2533 sigma / sqrt(n),
    sigma estimated robustly as 1.4826 x the median absolute deviation (0 for fewer than 2)."""
    if len(times) < 2:
        return 0.0
    median = statistics.median(times)
    mad = statistics.median(abs(t - median) for t in times)
    return 1.2533 * 1.4826 * mad / (median * len(times) ** 0.5) if median > 0 else 0.0


def pooled(ratios: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The mean of the pairs' ratios and its noise: the larger of what each pair's own noise
    gives the mean (independent errors) and the spread between the pairs (the standard error
    of their mean), so that pairs which disagree count as noise.

    >>> mean, noise = pooled([(0.9, 0.05), (0.94, 0.05)])
    >>> round(mean, 3), round(noise, 4)
    (0.92, 0.0354)
    """
    values = [ratio for ratio, _ in ratios]
    n = len(values)
    own = sum(noise * noise for _, noise in ratios) ** 0.5 / n
    spread = statistics.stdev(values) / n ** 0.5 if n > 1 else 0.0
    return statistics.fmean(values), max(own, spread)


def ratio_noise(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard error of median(a) / median(b), relative to it (independent errors)."""
    return (median_error(a) ** 2 + median_error(b) ** 2) ** 0.5
