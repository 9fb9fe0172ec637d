"""Which rank is slow: every rank's backward pass compared at a control point.

A rank whose compute is slower than the others' (thermal throttling, a noisy neighbour) holds
every collective up: the others wait for its gradients at each reduction, so their own timings
show waits, not the cause. Each rank measures its own backward pass (from the end of its
forward pass to its last gradient, which no reduction delays), the ranks exchange the medians
at control points, and :func:`compare_ranks` names the slowest one when it is slower than the
median of the other ranks by more than :data:`SLOW_RATIO` (the others: with two ranks, a median
that counted the slow one would halve what it is slower by). Plans are then made on that rank's ready times:
a collective completes when its last rank contributes, so the slow rank's gaps between
gradients are the ones a plan can fill.

>>> report = compare_ranks([0.200, 0.204, 0.290, 0.198])
>>> report.slow_rank, round(report.ratio, 2), report.median_s
(2, 1.45, 0.2)
>>> round(compare_ranks([0.200, 0.300]).ratio, 2)  # two ranks: the slow one against the other
1.5
>>> compare_ranks([0.200, 0.210]).slow_rank is None  # 5% apart: noise, nobody named
True

A rank slow only now and then (in bursts: throttling that comes and goes) keeps a fast median,
so each rank also sends its backward pass in each of its latest rounds (up to
:data:`BURST_WINDOW`), and the rank with the most slow rounds is named slow in bursts where it has :data:`BURST_ROUNDS` of them or more (one
slow round is a hiccup), counting only rounds :data:`BURST_RATIO` times the others' median or slower. Plans stay on the medians: most iterations are the fast ones.

>>> bursts = compare_ranks([0.200, 0.201], [[0.2, 0.2, 0.2, 0.2], [0.4, 0.2, 0.2, 0.4]])
>>> bursts.slow_rank, bursts.burst_rank, bursts.burst_rounds, bursts.burst_of, round(bursts.burst_ratio, 2)
(None, 1, 2, 4, 2.0)
>>> compare_ranks([0.200, 0.201], [[0.2] * 4, [0.4, 0.2, 0.2, 0.2]]).burst_rank is None  # one slow round
True

A rank whose link is slower (a bad cable, a shared port) leaves every rank's backward pass as it
was, and a ring collective goes at its pace on every rank alike, so neither tells it apart. With
three ranks or more each rank times, at every control point, a transfer to the next rank of the
ring (:func:`gradsched.runtime.planning.probe.probe_ring`, the ranks taking turns); a rank's link
carries both its transfer out and the one in from the rank before, so the rank whose faster
of the two is :data:`LINK_RATIO` times the other ranks' median or slower is named
(:func:`slow_link`: the others have at least one neighbour with a fast link). Two ranks share
the one path between them: which end is slow cannot be told there.

>>> slow_link([0.010, 0.040, 0.041, 0.010])  # rank 2's link 4x slower: 1->2 and 2->3 slow
(2, 4.0, 0.01)
>>> slow_link([0.010, 0.011, 0.010])[0] is None
True

A link is named slow from each rank's median over its latest probes (up to :data:`LINK_WINDOW`),
and every probe is also judged alone (the ranks probe at the same control points): a link is
slow throughout where the medians and every probe name it, and slow in bursts (another tenant's
traffic, by the clock) where :data:`LINK_BURST_PROBES` probes or more name it, not all (one is a
hiccup):

>>> fast, slow = [0.01, 0.01, 0.01], [0.01, 0.04, 0.04]  # one probe: rank 2's link 4x slower, or not
>>> report = compare_ranks([0.2] * 3, link_probes=list(zip(fast, slow, fast, slow, fast)))
>>> report.link_rank, report.link_burst_rank, report.link_burst_probes, report.link_probes_of, report.link_burst_ratio
(None, 2, 2, 5, 4.0)

On hosts of several ranks (``ranks_per_host`` P, the ranks of a host consecutive, as torchrun
numbers them) a rank's transfer to a rank of its own host crosses no link; the transfers that
leave a host (its last rank's, to the next host's first) are judged as one rank's would be, and
a slow link is a host's (``link_rank`` is then a host, the report says so):

>>> hosts = compare_ranks([0.2] * 6, link_probes=[[0.001], [0.01], [0.001], [0.04], [0.001], [0.04]], ranks_per_host=2)
>>> hosts.link_rank, hosts.describe().split("; ")[1][:40]
(2, "host 2's link (ranks 4-5) is slow: its t")
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

#: a rank whose backward pass takes this many times the other ranks' median is named slow (below it,
#: the ranks of a replay differ by a few percent between runs)
SLOW_RATIO = 1.10
#: rounds each rank reports for bursts (its latest); how many of them must be slow to name it, and how
#: slow a round must be to count (a rank's rounds vary by more than SLOW_RATIO now and then on a busy host)
BURST_WINDOW = 64
BURST_ROUNDS = 2
BURST_RATIO = 1.5
#: a rank whose transfers to and from its ring neighbours both take this many times the other ranks'
#: median is named as having a slow link (transfers of the same bytes over equal links differ by a few
#: percent)
LINK_RATIO = 1.25
#: probes each rank reports (its latest); in how many of them a link must be named alone to be named
#: slow in bursts
LINK_WINDOW = 16
LINK_BURST_PROBES = 2


@dataclass(frozen=True)
class RanksReport:
    """Every rank's median backward pass at the latest control point, and the verdict."""

    backward_s: tuple[float | None, ...]  # per rank, in rank order (None: nothing measured there yet)
    median_s: float  # the other ranks' median (all but the slowest)
    slow_rank: int | None  # the slowest rank, where it is slow by more than SLOW_RATIO; else None
    ratio: float  # the slowest rank's backward pass over the others' median (1.0: all alike)
    burst_rank: int | None = None  # another rank, slow in BURST_ROUNDS or more of its latest rounds; else None
    burst_rounds: int = 0  # how many of them were slow (BURST_RATIO times the others' median or more)
    burst_of: int = 0  # of how many of its rounds compared
    burst_slowest_s: float | None = None  # its slowest backward pass among them
    link_out_s: tuple[float | None, ...] | None = None  # per rank, its probe transfer to the next rank (3+ ranks),
    # the median over its latest probes
    link_rank: int | None = None  # the rank whose link is slow (LINK_RATIO, see slow_link), in every probe; else None
    link_ratio: float = 1.0  # the slowest link's faster transfer over the other ranks' median (the medians)
    link_median_s: float | None = None  # the other ranks' median (each rank's faster transfer, in or out)
    link_burst_rank: int | None = None  # a rank whose link LINK_BURST_PROBES or more probes alone named, not all
    link_burst_probes: int = 0  # in how many
    link_probes_of: int = 0  # of how many probes judged alone
    link_burst_ratio: float | None = None  # its link's largest ratio among them
    link_probes: tuple[tuple[float, ...], ...] | None = None  # per rank, the probes judged, oldest first
    ranks_per_host: int = 1  # > 1: the links judged are hosts' (link_rank, link_burst_rank, link_out_s, link_probes by host)

    @property
    def burst_ratio(self) -> float | None:
        """The bursty rank's slowest backward pass over the others' median."""
        return None if self.burst_slowest_s is None else self.burst_slowest_s / self.median_s

    def describe(self) -> str:
        """The verdict in words (for the log)."""
        if self.slow_rank is None:
            text = f"the ranks' backward passes are within {SLOW_RATIO - 1:.0%} of each other"
        else:
            slow = self.backward_s[self.slow_rank]
            text = (f"rank {self.slow_rank} is slow: its backward pass takes {self.ratio:.2f}x the other ranks' "
                    f"median ({slow * 1e3:.1f} ms against {self.median_s * 1e3:.1f} ms); every reduction waits for "
                    f"it, and plans are made on its ready times")
        if self.burst_rank is not None:
            text += (f"{'; ' if self.slow_rank is not None else ' in the median, but '}rank {self.burst_rank} is slow "
                     f"in bursts: {self.burst_rounds} of its latest {self.burst_of} backward passes took "
                     f"{BURST_RATIO:.2f}x the other ranks' median or more, the slowest {self.burst_ratio:.2f}x "
                     f"({self.burst_slowest_s * 1e3:.1f} ms); plans stay on the medians")
        if self.link_rank is not None:
            text += (f"; {self.whose_link(self.link_rank)} is slow: its transfers to and from its ring neighbours took "
                     f"{self.link_ratio:.2f}x the other ranks' median ({self.link_ratio * self.link_median_s * 1e3:.1f} "
                     f"ms against {self.link_median_s * 1e3:.1f} ms); every ring collective goes at its pace")
        if self.link_burst_rank is not None:
            text += (f"; {self.whose_link(self.link_burst_rank)} is slow in bursts: in {self.link_burst_probes} of the "
                     f"latest {self.link_probes_of} probes its transfers to and from its ring neighbours took "
                     f"{LINK_RATIO:.2f}x the other ranks' or more, up to {self.link_burst_ratio:.2f}x")
        return text

    def whose_link(self, index: int) -> str:
        """The link ``index`` names, in words (:func:`whose_link`)."""
        return whose_link(index, self.ranks_per_host)

    @property
    def verdict(self) -> tuple[int | None, int | None, int | None, int | None]:
        """(the slow rank, the rank slow in bursts, the rank with a slow link, the rank with a link slow in
        bursts): what a change of is said."""
        return self.slow_rank, self.burst_rank, self.link_rank, self.link_burst_rank

    @property
    def named(self) -> bool:
        """Whether any rank is named (slow, slow in bursts, or its link slow)."""
        return any(rank is not None for rank in self.verdict)


def whose_link(index: int, ranks_per_host: int = 1) -> str:
    """"rank 2's link", or on hosts of several ranks (the links judged then hosts') "host 1's link
    (ranks 2-3)"."""
    per = ranks_per_host
    return f"rank {index}'s link" if per == 1 else f"host {index}'s link (ranks {index * per}-{index * per + per - 1})"


def slow_link(out_s: Sequence[float | None]) -> tuple[int | None, float, float] | None:
    """From each rank's probe transfer to the next rank of the ring (``out_s[r]``: rank r to
    rank r+1, the last to rank 0; seconds): (the rank whose link is slow, or None; its faster
    transfer, in or out, over the other ranks' median of theirs; that median). None with fewer
    than three ranks, or where one has not measured."""
    n = len(out_s)
    if n < 3 or any(s is None or not s > 0 for s in out_s):
        return None
    faster = [min(out_s[r], out_s[r - 1]) for r in range(n)]  # rank r's out, and the one in from r - 1
    slowest = max(range(n), key=lambda r: (faster[r], -r))
    median = statistics.median(s for r, s in enumerate(faster) if r != slowest)
    ratio = faster[slowest] / median
    return (slowest if ratio >= LINK_RATIO else None), ratio, median


def compare_ranks(backward_s: Sequence[float | None],
                  spans: Sequence[Sequence[float]] | None = None,
                  link_probes: Sequence[Sequence[float]] | None = None, ranks_per_host: int = 1) -> RanksReport | None:
    """The report for every rank's median backward pass (seconds, in rank order; None where a
    rank measured none yet) and, where given, each rank's backward pass in each of its latest
    rounds and its probe transfers to the next rank, the latest probes in the order they were
    made, at the same control points on every rank (:func:`slow_link`), on hosts of
    ``ranks_per_host`` ranks those that leave each host; None where fewer than two ranks
    measured a backward pass."""
    report = _compare_backward(backward_s, spans)
    if report is None or not link_probes or not all(link_probes):
        return report
    if ranks_per_host > 1:  # what leaves each host: its last rank's transfer, to the next host's first
        link_probes = list(link_probes)[ranks_per_host - 1 :: ranks_per_host]
        report = replace(report, ranks_per_host=ranks_per_host)
    medians = [statistics.median_high(probes) for probes in link_probes]
    links = slow_link(medians)
    if links is None:
        return report
    rank, ratio, median = links
    report = replace(report, link_out_s=tuple(medians), link_ratio=ratio, link_median_s=median)
    return _link_verdict(report, rank, link_probes)


def _link_verdict(report: RanksReport, steady: int | None, link_probes: Sequence[Sequence[float]]) -> RanksReport:
    """``report`` with its links named: ``steady`` (named from the medians) slow throughout where
    every probe judged alone (the ranks' k-th latest together) names it too; else the rank the
    most probes name alone, where they are :data:`LINK_BURST_PROBES` or more, slow in bursts."""
    probes = min(len(p) for p in link_probes)
    named: dict[int, list[float]] = {}
    for k in range(1, probes + 1):
        verdict = slow_link([p[-k] for p in link_probes])
        if verdict is not None and verdict[0] is not None:
            named.setdefault(verdict[0], []).append(verdict[1])
    report = replace(report, link_probes_of=probes, link_probes=tuple(tuple(p[-probes:]) for p in link_probes))
    if steady is not None and len(named.get(steady, ())) == probes:
        report = replace(report, link_rank=steady)
        named.pop(steady)
    if not named:
        return report
    rank, ratios = max(named.items(), key=lambda item: (len(item[1]), -item[0]))
    if len(ratios) < LINK_BURST_PROBES:
        return report
    return replace(report, link_burst_rank=rank, link_burst_probes=len(ratios), link_burst_ratio=max(ratios))


def _compare_backward(backward_s: Sequence[float | None],
                      spans: Sequence[Sequence[float]] | None) -> RanksReport | None:
    measured = [(rank, s) for rank, s in enumerate(backward_s) if s is not None and s > 0]
    if len(measured) < 2:
        return None
    slowest, seconds = max(measured, key=lambda item: (item[1], -item[0]))
    median = statistics.median(s for rank, s in measured if rank != slowest)
    ratio = seconds / median if median > 0 else 1.0
    slow = slowest if ratio > SLOW_RATIO else None
    report = RanksReport(tuple(backward_s), median, slow, ratio)
    if spans is None or not median > 0:
        return report
    counts = [(sum(s >= BURST_RATIO * median for s in rounds), rank) for rank, rounds in enumerate(spans)
              if rank != slow and rounds and backward_s[rank] is not None]
    if not counts:
        return report
    count, rank = max(counts, key=lambda item: (item[0], -item[1]))
    if count < BURST_ROUNDS:
        return report
    return replace(report, burst_rank=rank, burst_rounds=count, burst_of=len(spans[rank]),
                   burst_slowest_s=max(spans[rank]))
