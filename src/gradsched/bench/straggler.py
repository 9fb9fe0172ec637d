"""One slow worker in the bench (``--straggler``): which rank, how much slower, whether its
compute or its link, and whether throughout or in bursts.

A compute straggler's replayed layers take ``factor`` times their time on that rank (thermal
throttling, a noisy neighbour); a link straggler's namespace link is ``factor`` times slower in
both directions (a slower or shared NIC), so every ring all-reduce runs at its pace. Bursts of a
slow compute come in ``slow`` of every ``period`` iterations (counted from each run's first step,
the warm-up included, on that rank: a throttled GPU is slow for whole steps); bursts of a slow
link come by the clock, ``slow_s`` of every ``period_s`` seconds (another tenant's traffic does
not wait for our steps: gradsched.bench.link_bursts). With bursts the bench reports the mean
over the timed iterations instead of the median (the median would pick the fast or the slow
iterations, whichever are more).

>>> s = Straggler.parse("1:1.5")
>>> s.rank, s.factor, s.link, s.steady, s.describe()
(1, 1.5, False, True, 'rank 1 computes 1.5x slower')
>>> b = Straggler.parse("0:2:burst=1/4")
>>> [b.slow_at(i) for i in range(5)], b.mean_factor, b.describe()
([True, False, False, False, True], 1.25, 'rank 0 computes 2x slower in 1 of every 4 iterations')
>>> Straggler.parse("1:1.5:link").describe()
"rank 1's link is 1.5x slower"
>>> Straggler.parse("3:2:link").describe(procs_per_node=2)  # hosts of 2 ranks: host 3 // 2's link, shared
"host 1's link (its 2 ranks share it) is 2x slower"
>>> t = Straggler.parse("2:3:link:burst=100ms/0.4s")
>>> t.slow_s, t.period_s, t.link_bursts, t.describe()
(0.1, 0.4, True, "rank 2's link is 3x slower for 100 ms of every 400 ms")
>>> t.rate_share  # of the link's own rate, averaged over the clock: 3/4 fast, 1/4 at a third
0.8333333333333334
>>> Straggler.from_json([1, 1.5]) == s  # the form runs of an earlier version kept
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..sim.cluster import LinkBursts
from ..units import format_duration, parse_duration

USAGE = ("RANK:FACTOR[:link][:burst=SLOW/PERIOD], such as 1:1.5, 1:1.5:link, 1:2:burst=1/4 (iterations) or "
         "1:2:link:burst=100ms/400ms (a link's, by the clock)")


@dataclass(frozen=True)
class Straggler:
    rank: int
    factor: float  # that many times slower (> 1)
    link: bool = False  # its link in both directions, not its compute
    slow: int = 0  # compute bursts: slow in the first ``slow`` of every ``period`` iterations (0: throughout)
    period: int = 0
    slow_s: float = 0.0  # link bursts: slow for ``slow_s`` of every ``period_s`` seconds, undilated (0: throughout)
    period_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"--straggler's factor must be > 1 (that many times slower), got {self.factor}")
        if self.slow or self.period:
            if not 0 < self.slow < self.period:
                raise ValueError(f"--straggler's burst=SLOW/PERIOD needs 0 < SLOW < PERIOD (iterations), got "
                                 f"{self.slow}/{self.period}")
            if self.link:
                raise ValueError("--straggler: a link's bursts come by the clock, not by a rank's steps: "
                                 "burst=SLOW/PERIOD as durations, e.g. 1:2:link:burst=100ms/400ms")
        if self.slow_s or self.period_s:
            if not 0 < self.slow_s < self.period_s:
                raise ValueError(f"--straggler's burst=SLOW/PERIOD needs 0 < SLOW < PERIOD, got "
                                 f"{self.slow_s:g} s/{self.period_s:g} s")
            if not self.link:
                raise ValueError("--straggler: a rank's compute is slow for whole steps: burst=SLOW/PERIOD in "
                                 "iterations, e.g. 1:2:burst=1/4 (durations are for a link's bursts)")

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """From ``--straggler``'s text (see :data:`USAGE`)."""
        parts = text.split(":")
        try:
            rank, factor = int(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            raise ValueError(f"--straggler must be {USAGE}; got {text!r}") from None
        link, burst = False, None
        for part in parts[2:]:
            if part == "link" and not link:
                link = True
            elif (found := re.fullmatch(r"burst=([^/]+)/([^/]+)", part)) and burst is None:
                burst = found.group(1), found.group(2)
            else:
                raise ValueError(f"--straggler must be {USAGE}; got {text!r} ({part!r} is neither 'link' nor "
                                 "burst=SLOW/PERIOD, or repeats)")
        if burst is None:
            return cls(rank, factor, link)
        if all(b.isdigit() for b in burst):
            return cls(rank, factor, link, slow=int(burst[0]), period=int(burst[1]))
        try:
            slow_s, period_s = parse_duration(burst[0]), parse_duration(burst[1])
        except ValueError as exc:
            raise ValueError(f"--straggler's burst=SLOW/PERIOD: iterations (1/4) or durations (100ms/400ms): "
                             f"{exc}") from None
        return cls(rank, factor, link, slow_s=slow_s, period_s=period_s)

    @classmethod
    def from_json(cls, data) -> Straggler | None:
        if data is None:
            return None
        if isinstance(data, (list, tuple)):  # [rank, factor]: a steady compute straggler, as first kept
            return cls(int(data[0]), float(data[1]))
        return cls(**data)

    def as_json(self) -> dict:
        return {"rank": self.rank, "factor": self.factor, "link": self.link, "slow": self.slow, "period": self.period,
                "slow_s": self.slow_s, "period_s": self.period_s}

    @property
    def steady(self) -> bool:
        return not self.period and not self.period_s

    def slow_at(self, iteration: int) -> bool:
        """Whether the rank computes slowly in its ``iteration``-th step of a run (0 the first)."""
        return not self.compute_bursts or iteration % self.period < self.slow

    @property
    def mean_factor(self) -> float:
        """How many times slower the rank is on average over a whole number of periods (a link in
        bursts: see :attr:`rate_share`)."""
        return 1 + (self.factor - 1) * self.slow / self.period if self.compute_bursts else self.factor

    @property
    def compute_bursts(self) -> bool:
        """A compute slowed in bursts of iterations (paced step by step on its rank)."""
        return bool(self.period)

    @property
    def link_bursts(self) -> bool:
        """A link slowed in bursts by the clock (gradsched.bench.link_bursts)."""
        return bool(self.period_s)

    @property
    def bursts(self) -> LinkBursts | None:
        """A link's bursts by the clock as the simulator models them (None: no such bursts)."""
        return LinkBursts(self.factor, self.slow_s, self.period_s) if self.link_bursts else None

    @property
    def rate_share(self) -> float:
        """The share of its own rate the straggler's link carries, averaged over the clock (1: no
        link straggler)."""
        if not self.link:
            return 1.0
        return self.bursts.rate_share if self.link_bursts else 1 / self.factor

    def compute_factor(self, rank: int) -> float:
        """The factor ``rank``'s replayed compute is built with: the steady compute straggler's
        (bursts are paced step by step; a link straggler computes as the others)."""
        return self.factor if rank == self.rank and self.steady and not self.link else 1.0

    def host(self, procs_per_node: int = 1) -> int:
        """The emulated host whose link a link straggler slows: RANK // ``procs_per_node`` (its
        ranks share the link; with one torchrun per host, the rendezvous decides which ranks
        those are)."""
        return self.rank // procs_per_node

    def describe(self, procs_per_node: int = 1) -> str:
        """In words; with hosts of ``procs_per_node`` ranks a link straggler's link is a host's."""
        what = f"rank {self.rank} computes" if not self.link else f"rank {self.rank}'s link is" \
            if procs_per_node == 1 else f"host {self.host(procs_per_node)}'s link (its {procs_per_node} ranks share it) is"
        when = "" if self.steady else f" in {self.slow} of every {self.period} iterations" if self.period else \
            f" for {format_duration(self.slow_s)} of every {format_duration(self.period_s)}"
        return f"{what} {self.factor:g}x slower{when}"

    def check(self, workers: int, replay: bool, iters: int) -> None:
        """Raises for a straggler the bench cannot run with these settings."""
        if not replay and not self.link:
            raise ValueError("--straggler slows a replayed model's compute: choose a replay model (or a slower link: "
                             "RANK:FACTOR:link)")
        if not 0 <= self.rank < workers:
            raise ValueError(f"--straggler names a worker: a rank in 0..{workers - 1}, got {self.rank}")
        if self.period and iters % self.period:
            raise ValueError(f"--straggler with bursts: --iters must be a whole number of periods ({self.period}), "
                             f"got {iters}, so that the mean counts slow and fast iterations as they come")
