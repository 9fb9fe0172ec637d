"""One slow worker in the bench (``--straggler``): which rank, how much slower, whether its
compute or its link, and whether throughout or in bursts.

A compute straggler's replayed layers take ``factor`` times their time on that rank (thermal
throttling, a noisy neighbour); a link straggler's namespace link is ``factor`` times slower in
both directions (a slower or shared NIC), so every ring all-reduce runs at its pace. Bursts slow
the rank in ``slow`` of every ``period`` iterations (counted from each run's first step, the
warm-up included, on that rank), and the bench then reports the mean over its timed iterations,
which are a whole number of periods, instead of the median (the median would pick the fast or
the slow iterations, whichever are more).

>>> s = Straggler.parse("1:1.5")
>>> s.rank, s.factor, s.link, s.steady, s.describe()
(1, 1.5, False, True, 'rank 1 computes 1.5x slower')
>>> b = Straggler.parse("0:2:burst=1/4")
>>> [b.slow_at(i) for i in range(5)], b.mean_factor, b.describe()
([True, False, False, False, True], 1.25, 'rank 0 computes 2x slower in 1 of every 4 iterations')
>>> Straggler.parse("1:1.5:link").describe()
"rank 1's link is 1.5x slower"
>>> Straggler.from_json([1, 1.5]) == s  # the form runs of an earlier version kept
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

USAGE = "RANK:FACTOR[:link][:burst=SLOW/PERIOD], such as 1:1.5, 1:1.5:link or 1:2:burst=1/4"


@dataclass(frozen=True)
class Straggler:
    rank: int
    factor: float  # that many times slower (> 1)
    link: bool = False  # its link in both directions, not its compute
    slow: int = 0  # bursts: slow in the first ``slow`` of every ``period`` iterations (0: throughout)
    period: int = 0

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"--straggler's factor must be > 1 (that many times slower), got {self.factor}")
        if self.slow or self.period:
            if not 0 < self.slow < self.period:
                raise ValueError(f"--straggler's burst=SLOW/PERIOD needs 0 < SLOW < PERIOD (iterations), got "
                                 f"{self.slow}/{self.period}")
            if self.link:
                raise ValueError("--straggler: a slower link is steady (its rate is set once per run); bursts slow a "
                                 "rank's compute")

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """From ``--straggler``'s text (see :data:`USAGE`)."""
        parts = text.split(":")
        try:
            rank, factor = int(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            raise ValueError(f"--straggler must be {USAGE}; got {text!r}") from None
        link, slow, period = False, 0, 0
        for part in parts[2:]:
            burst = re.fullmatch(r"burst=(\d+)/(\d+)", part)
            if part == "link" and not link:
                link = True
            elif burst and not period:
                slow, period = int(burst.group(1)), int(burst.group(2))
            else:
                raise ValueError(f"--straggler must be {USAGE}; got {text!r} ({part!r} is neither 'link' nor "
                                 "burst=SLOW/PERIOD, or repeats)")
        return cls(rank, factor, link, slow, period)

    @classmethod
    def from_json(cls, data) -> Straggler | None:
        if data is None:
            return None
        if isinstance(data, (list, tuple)):  # [rank, factor]: a steady compute straggler, as first kept
            return cls(int(data[0]), float(data[1]))
        return cls(**data)

    def as_json(self) -> dict:
        return {"rank": self.rank, "factor": self.factor, "link": self.link, "slow": self.slow, "period": self.period}

    @property
    def steady(self) -> bool:
        return not self.period

    def slow_at(self, iteration: int) -> bool:
        """Whether the rank is slow in its ``iteration``-th step of a run (0 the first)."""
        return self.steady or iteration % self.period < self.slow

    @property
    def mean_factor(self) -> float:
        """How many times slower the rank is on average over a whole number of periods."""
        return self.factor if self.steady else 1 + (self.factor - 1) * self.slow / self.period

    def compute_factor(self, rank: int) -> float:
        """The factor ``rank``'s replayed compute is built with: the steady compute straggler's
        (bursts are paced step by step; a link straggler computes as the others)."""
        return self.factor if rank == self.rank and self.steady and not self.link else 1.0

    def describe(self) -> str:
        what = f"rank {self.rank}'s link is" if self.link else f"rank {self.rank} computes"
        when = "" if self.steady else f" in {self.slow} of every {self.period} iterations"
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
