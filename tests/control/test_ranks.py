"""Which rank is slow (gradsched.control.ranks): hand-computed verdicts."""

from __future__ import annotations

import pytest

from gradsched.control.ranks import SLOW_RATIO, compare_ranks


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
