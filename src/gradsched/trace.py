"""Chrome trace JSON (the Trace Event Format), which Perfetto and chrome://tracing open.

Times are given in seconds and written in microseconds. Events that may overlap go on
separate threads (tracks): the caller picks the track, :func:`pack_lanes` helps.

>>> t = ChromeTrace()
>>> t.name_thread(0, 1, "compute")
>>> t.complete(0, 1, "conv1", start=0.001, duration=0.002, cat="forward")
>>> t.to_json()["traceEvents"][-1]["dur"]
2000.0
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


class ChromeTrace:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def name_process(self, pid: int, name: str, sort_index: int | None = None) -> None:
        self.events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        if sort_index is not None:
            self.events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": sort_index}})

    def name_thread(self, pid: int, tid: int, name: str) -> None:
        self.events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        self.events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})

    def complete(
        self, pid: int, tid: int, name: str, start: float, duration: float, cat: str = "", args: dict | None = None
    ) -> None:
        event = {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": start * 1e6, "dur": max(duration, 0.0) * 1e6}
        if cat:
            event["cat"] = cat
        if args:
            event["args"] = args
        self.events.append(event)

    def instant(self, pid: int, tid: int, name: str, at: float, cat: str = "", args: dict | None = None) -> None:
        event = {"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": name, "ts": at * 1e6}
        if cat:
            event["cat"] = cat
        if args:
            event["args"] = args
        self.events.append(event)

    def to_json(self) -> dict[str, Any]:
        return {"traceEvents": self.events, "displayTimeUnit": "ms"}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))


def pack_lanes(intervals: Iterable[tuple[float, float]]) -> list[int]:
    """Greedy lane for each (start, end), in the given order, so no two in a lane overlap."""
    ends: list[float] = []
    lanes = []
    for start, end in intervals:
        for lane, busy_until in enumerate(ends):
            if busy_until <= start:
                ends[lane] = end
                lanes.append(lane)
                break
        else:
            ends.append(end)
            lanes.append(len(ends) - 1)
    return lanes
