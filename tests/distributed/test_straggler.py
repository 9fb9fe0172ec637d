"""One slow rank (issue 58, part 2): every rank names it, in stats, the log and the trace, and
rank 0 plans on its ready times; training stays DDP's."""

from __future__ import annotations

import json

import pytest

from workers.launch import run_ranks


def test_a_slow_rank_is_named_everywhere_and_planned_on(tmp_path):
    out = tmp_path / "out.json"
    results = run_ranks("straggler", 2, str(out), "1", str(tmp_path / "trace.json"), timeout=180)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    ranks = json.loads(out.read_text())
    for report in ranks:
        assert report["slow_rank"] == 1
        fast, slow = report["ranks"]["backward_s"]
        assert slow > 1.5 * fast and report["ranks"]["ratio"] == pytest.approx(slow / report["ranks"]["median_s"])
        # the plan's predicted span is about the slow rank's backward pass (6 layers of 4 ms), not the fast one's
        assert report["span_s"] > 0.7 * slow
        assert report["max_abs_diff"] == 0.0
    said = [line for line in ranks[0]["said"] if "is slow" in line]
    assert said and said[0].startswith("WARNING") and "rank 1 is slow" in said[0]
    assert not any("is slow" in line for line in ranks[1]["said"])  # said once, by rank 0
    trace = json.loads((tmp_path / "trace.rank0.json").read_text())
    marks = [e for e in trace["traceEvents"] if e.get("ph") == "i" and e.get("cat") == "ranks"]
    assert marks and marks[0]["name"].startswith("slow rank 1")
