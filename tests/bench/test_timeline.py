"""The bench's timeline picture: which runs it draws, and the iteration it cuts from a trace
(synthetic traces written by the runtime's own trace writer)."""

from __future__ import annotations

import pytest

from gradsched.bench.timeline import timeline_runs
from gradsched.runtime.diagnostics.tracing import RunTrace

pytest.importorskip("matplotlib")
from gradsched.plot import plot_iteration_timelines, trace_iteration  # noqa: E402


def rows(*cells):
    return {"results": [{"policy": p, "bandwidth_gbps": g, "iteration_s": t} for p, g, t in cells]}


def test_the_reference_and_the_fastest_policy_at_the_last_bandwidth():
    data = rows(("ddp", 1.0, 1.0), ("fifo", 1.0, 0.9), ("prophet", 1.0, 0.95),
                ("ddp", 3.0, 0.5), ("fifo", 3.0, 0.45), ("bytescheduler", 3.0, 0.40), ("prophet", 3.0, 0.41),
                ("prophet+clip", 3.0, 0.30))
    assert timeline_runs(data) == ["ddp", "bytescheduler"]
    assert timeline_runs(rows(("fifo", 3.0, 0.5), ("prophet", 3.0, 0.4))) == ["fifo", "prophet"]  # servers: no DDP
    assert timeline_runs(rows(("ddp", 3.0, 0.5))) == ["ddp"]
    assert timeline_runs({"results": []}) == []


def _trace(tmp_path, iterations: int, period: float) -> str:
    trace = RunTrace(0)
    t0 = trace.origin
    for r in range(1, iterations + 1):
        start = t0 + (r - 1) * period
        trace.span("forward", "layers.0", start, start + 0.1 * period)
        trace.span("forward", "layers.1", start + 0.1 * period, start + 0.3 * period)
        trace.ready(r, "w1", start + 0.5 * period, start + 0.3 * period)
        trace.ready(r, "w0", start + 0.7 * period, start + 0.5 * period)
        trace.on_exchange("launch", r, 0, 1000, start + 0.7 * period, ["w1", "w0"])
        trace.on_exchange("done", r, 0, 1000, start + 1.05 * period)  # into the next iteration
        trace.span("wait", "module layers.0", start + period, start + 1.05 * period)
    return trace.save(str(tmp_path / "run.json"))


def test_one_steady_iteration_is_cut_from_a_trace(tmp_path):
    path = _trace(tmp_path, 5, 0.2)
    lo, hi, events = trace_iteration(path)
    assert hi - lo == pytest.approx(0.2, abs=1e-6)  # from the 3rd forward pass to the 4th
    messages = [e for e in events if e["cat"] == "message"]
    assert [e["args"]["round"] for e in messages] == [2, 3]  # the one before ends inside it
    assert {e["name"] for e in events if e["cat"] == "wait"} == {"module layers.0"}
    with pytest.raises(ValueError, match="at least 3 needed"):
        trace_iteration(_trace(tmp_path, 2, 0.2))


def test_the_picture_is_written(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast, slow = _trace(tmp_path / "a", 4, 0.1), _trace(tmp_path / "b", 4, 0.3)
    out = tmp_path / "timeline.png"
    plot_iteration_timelines([("ddp", slow), ("prophet", fast)], out, "a test", dilation=3.0)
    assert out.read_bytes()[:4] == b"\x89PNG"
