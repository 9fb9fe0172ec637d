"""Simulated runs as Chrome traces: one process per policy, tracks for compute and links."""

from __future__ import annotations

from typing import Sequence

from ..trace import ChromeTrace, pack_lanes
from .simulator import SimResult

COMPUTE_TID = 1
LINK_TID = 10  # + lane index (link, or push / pull)
FLIGHT_TID = 100  # + packed lane: each message from launch to completion


def _label(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1}"


def sim_trace(results: Sequence[SimResult]) -> ChromeTrace:
    """Compute, wire occupancy and in-flight messages of each result, side by side."""
    trace = ChromeTrace()
    for pid, result in enumerate(results):
        trace.name_process(pid, f"{result.policy} ({result.model}, {result.cluster.describe()})", pid)
        trace.name_thread(pid, COMPUTE_TID, "compute")
        for rec in result.compute:
            trace.complete(pid, COMPUTE_TID, rec.layer, rec.start, rec.end - rec.start, rec.phase,
                           {"iteration": rec.iteration})
        for time, event, iteration, subject in result.log:
            if event == "ready":
                trace.instant(pid, COMPUTE_TID, f"ready {subject}", time, "ready", {"iteration": iteration})
        lanes = {}
        for rec in result.messages:
            for seg in rec.segments:
                cast = seg.lane.startswith("cast")  # compression's casts, not the wire
                if seg.lane not in lanes:
                    lanes[seg.lane] = LINK_TID + len(lanes)
                    trace.name_thread(pid, lanes[seg.lane],
                                      f"{seg.lane} ({'to and from the wire dtype' if cast else 'bytes on the wire'})")
                trace.complete(pid, lanes[seg.lane], _label(rec.names), seg.start, seg.end - seg.start,
                               "cast" if cast else "wire",
                               {"message": rec.id, "bytes": rec.nbytes, "iteration": rec.iteration})
        ordered = sorted(result.messages, key=lambda r: (r.launched, r.id))
        packed = pack_lanes((r.launched, r.completed) for r in ordered)
        for lane in sorted(set(packed)):
            trace.name_thread(pid, FLIGHT_TID + lane, f"in flight {lane}")
        for rec, lane in zip(ordered, packed):
            trace.complete(pid, FLIGHT_TID + lane, _label(rec.names), rec.launched, rec.completed - rec.launched,
                           "message", {"message": rec.id, "bytes": rec.nbytes, "iteration": rec.iteration,
                                       "tensors": list(rec.names)})
    return trace
