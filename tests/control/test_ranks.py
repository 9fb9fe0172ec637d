"""Which rank is slow (gradsched.control.ranks): hand-computed verdicts."""

from __future__ import annotations

import pytest

from gradsched.control.ranks import LINK_BURST_PROBES, LINK_RATIO, SLOW_RATIO, compare_ranks, slow_link


def test_the_slowest_rank_is_named_against_the_others_median_not_the_fastest():
    report = compare_ranks([0.10, 0.30, 0.11, 0.12])
    assert report.slow_rank == 1 and report.median_s == pytest.approx(0.11)
    assert report.ratio == pytest.approx(0.30 / 0.11)
    assert "rank 1 is slow" in report.describe() and "2.73x" in report.describe()


def test_ranks_within_the_ratio_name_nobody():
    report = compare_ranks([0.100, 0.100 * SLOW_RATIO * 0.999, 0.100])
    assert report.slow_rank is None and report.ratio == pytest.approx(SLOW_RATIO * 0.999)
    assert "within 10%" in report.describe()


def test_ranks_that_measured_nothing_yet_are_left_out_and_two_are_needed():
    assert compare_ranks([None, 0.2]) is None and compare_ranks([0.2]) is None
    report = compare_ranks([None, 0.1, 0.3])
    assert report.slow_rank == 2 and report.median_s == pytest.approx(0.1) and report.backward_s[0] is None


def test_of_two_equally_slow_ranks_the_lower_is_named():
    assert compare_ranks([0.1, 0.3, 0.3, 0.1, 0.1]).slow_rank == 1


@pytest.mark.parametrize("slow", [0, 1, 3])
def test_a_slow_link_is_the_ranks_whose_transfers_in_and_out_are_both_slow(slow):
    """Rank ``slow``'s link 3x slower: the transfers into it (from the rank before) and out of it
    (to the next) take 3x; its neighbours each have one fast transfer left, and it none."""
    out = [0.010 + 0.0001 * r for r in range(4)]
    for r in (slow - 1, slow):  # rank slow-1 -> slow, and slow -> slow+1
        out[r] *= 3
    rank, ratio, median = slow_link(out)
    faster = [min(out[r], out[r - 1]) for r in range(4)]
    others = sorted(f for r, f in enumerate(faster) if r != slow)
    assert rank == slow and median == pytest.approx(others[1]) and ratio == pytest.approx(faster[slow] / others[1])


def test_links_within_the_ratio_or_two_ranks_or_one_unmeasured_name_nobody():
    assert slow_link([0.01, 0.01 * LINK_RATIO * 0.99, 0.01 * LINK_RATIO * 0.99])[0] is None
    assert slow_link([0.01, 0.04]) is None  # two ranks share the one path: which end is slow cannot be told
    assert slow_link([0.01, None, 0.04]) is None


def test_a_slow_link_is_named_in_the_report_beside_a_slow_rank_and_said():
    report = compare_ranks([0.10, 0.10, 0.10], link_probes=[[0.01], [0.04], [0.04]])
    assert report.slow_rank is None and report.link_rank == 2 and report.link_ratio == pytest.approx(4.0)
    assert report.link_median_s == pytest.approx(0.01) and report.link_out_s == (0.01, 0.04, 0.04)
    assert report.named and report.verdict == (None, None, 2, None)
    assert "rank 2's link is slow" in report.describe() and "4.00x" in report.describe()
    both = compare_ranks([0.10, 0.20, 0.10], link_probes=[[0.01], [0.04], [0.04]])
    assert both.verdict == (1, None, 2, None) and "rank 1 is slow" in both.describe()
    plain = compare_ranks([0.10, 0.10, 0.10], link_probes=[[0.01], [0.01], [0.01]])
    assert not plain.named and plain.link_rank is None and "link" not in plain.describe()
    assert compare_ranks([0.10, 0.10, 0.10]).link_out_s is None  # not probed (two ranks, or before the probe)
    assert compare_ranks([0.10, 0.10, 0.10], link_probes=[[], [], []]).link_out_s is None


def _probes(slow_at: list[bool], rank: int = 2, factor: float = 3.0) -> list[list[float]]:
    """Three ranks' probes, oldest first: rank ``rank``'s link ``factor`` times slower in those
    ``slow_at`` names (its transfer in, from the rank before, and out take that much longer)."""
    probes: list[list[float]] = [[], [], []]
    for k, slow in enumerate(slow_at):
        for r in range(3):
            crosses = slow and r in (rank - 1, rank)
            probes[r].append(0.010 * (factor if crosses else 1.0) + 0.0001 * k)
    return probes


def test_a_link_slow_in_some_probes_is_named_slow_in_bursts_and_not_throughout():
    report = compare_ranks([0.1] * 3, link_probes=_probes([False, True, False, False, True, False]))
    assert report.link_rank is None and report.link_out_s[2] < 0.011  # the medians are the fast probes'
    assert (report.link_burst_rank, report.link_burst_probes, report.link_probes_of) == (2, 2, 6)
    assert report.link_burst_ratio == pytest.approx(3.0, rel=0.02) and report.verdict == (None, None, None, 2)
    assert "rank 2's link is slow in bursts: in 2 of the latest 6 probes" in report.describe()


def test_one_slow_probe_is_a_hiccup_a_link_slow_in_every_probe_is_slow_throughout_in_most_in_bursts():
    assert LINK_BURST_PROBES == 2
    hiccup = compare_ranks([0.1] * 3, link_probes=_probes([False, False, True, False]))
    assert not hiccup.named and hiccup.link_probes_of == 4
    steady = compare_ranks([0.1] * 3, link_probes=_probes([True] * 5))
    assert steady.link_rank == 2 and steady.link_burst_rank is None and steady.link_ratio == pytest.approx(3.0, rel=0.02)
    mostly = compare_ranks([0.1] * 3, link_probes=_probes([True, True, False, True, True]))  # the median slow: the
    assert mostly.link_rank is None and mostly.link_out_s[2] > 0.029  # bursts alias with the probes, or last long
    assert (mostly.link_burst_rank, mostly.link_burst_probes, mostly.link_probes_of) == (2, 4, 5)
    assert len(mostly.link_probes) == 3 and mostly.link_probes[1] == tuple(_probes([True, True, False, True, True])[1])


def test_probes_are_judged_latest_first_as_far_as_every_rank_has_them():
    probes = _probes([True, True, False, False])
    probes[0] = probes[0][2:]  # rank 0 kept only its two latest: the slow ones are out of its window
    report = compare_ranks([0.1] * 3, link_probes=probes)
    assert report.link_probes_of == 2 and report.link_burst_rank is None


def test_on_hosts_of_several_ranks_the_links_judged_are_the_hosts():
    """3 hosts of 2 ranks (consecutive): within a host the transfer crosses no link (1 ms); host
    1's link 3x slower makes the transfers into it (1 -> 2) and out of it (3 -> 4) slow; judged per
    rank, every rank would have a fast transfer and none be named."""
    probe = [0.001, 0.030, 0.001, 0.030, 0.001, 0.010]
    report = compare_ranks([0.2] * 6, link_probes=[[p] for p in probe], ranks_per_host=2)
    assert report.ranks_per_host == 2 and report.link_rank == 1 and report.link_ratio == pytest.approx(3.0)
    assert report.link_out_s == (0.030, 0.030, 0.010)  # what leaves each host
    assert "host 1's link (ranks 2-3) is slow" in report.describe()
    assert compare_ranks([0.2] * 6, link_probes=[[p] for p in probe]).link_rank is None  # judged per rank
    bursts = compare_ranks([0.2] * 6, link_probes=[[0.01, p, 0.01, p] if p > 0.002 else [0.001] * 4 for p in probe],
                           ranks_per_host=2)
    assert bursts.link_rank is None and bursts.link_burst_rank == 1 and bursts.link_burst_probes == 2
    assert compare_ranks([0.2] * 4, link_probes=[[p] for p in probe[:4]], ranks_per_host=2).link_out_s is None  # 2 hosts
