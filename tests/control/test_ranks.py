"""Which rank is slow (gradsched.control.ranks): hand-computed verdicts."""

from __future__ import annotations

import pytest

from gradsched.control.ranks import LINK_RATIO, SLOW_RATIO, compare_ranks, slow_link


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
    report = compare_ranks([0.10, 0.10, 0.10], link_out_s=[0.01, 0.04, 0.04])
    assert report.slow_rank is None and report.link_rank == 2 and report.link_ratio == pytest.approx(4.0)
    assert report.link_median_s == pytest.approx(0.01) and report.link_out_s == (0.01, 0.04, 0.04)
    assert report.named and report.verdict == (None, None, 2)
    assert "rank 2's link is slow" in report.describe() and "4.00x" in report.describe()
    both = compare_ranks([0.10, 0.20, 0.10], link_out_s=[0.01, 0.04, 0.04])
    assert both.verdict == (1, None, 2) and "rank 1 is slow" in both.describe()
    plain = compare_ranks([0.10, 0.10, 0.10], link_out_s=[0.01, 0.01, 0.01])
    assert not plain.named and plain.link_rank is None and "link" not in plain.describe()
    assert compare_ranks([0.10, 0.10, 0.10]).link_out_s is None  # not probed (two ranks, or before the probe)
