"""Chrome trace of a real run on one rank (open it in https://ui.perfetto.dev).

Tracks: forward per module; backward between consecutive gradients; forward waits for
updates; optimizer updates; each message's queueing (its last gradient ready -> launch)
and its all-reduce (launch -> result), the latter on packed tracks so that messages in
flight together never share one; the ranks compared at control points (which one is slow).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Sequence

from gradsched.trace import ChromeTrace, pack_lanes

_TRACKS = {
    "forward": (1, "forward (per module)"),
    "backward": (2, "backward (between gradients)"),
    "wait": (3, "forward waits for updates"),
    "update": (4, "optimizer updates"),
    "queue": (5, "messages queued"),
    "ranks": (6, "the ranks compared (control points)"),
}


class RunTrace:
    """Collects events stamped with ``time.perf_counter``; thread-safe; written by ``save``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.origin = time.perf_counter()
        self._lock = threading.Lock()
        self._spans: list[tuple[str, str, float, float]] = []  # (track, name, start, end)
        self._ready: dict[tuple[int, str], float] = {}  # (round, tensor) -> ready time
        self._launched: dict[tuple[int, int], tuple[float, int, tuple[str, ...]]] = {}
        self._messages: list[tuple[int, int, tuple[str, ...], int, float, float]] = []
        self._last_ready = 0.0
        self._forward: tuple[str, float] | None = None  # (module, start) of the forward span still open
        self._marks: list[tuple[str, str, float, dict]] = []  # (track, name, at, args): instants

    def span(self, track: str, name: str, start: float, end: float) -> None:
        with self._lock:
            self._spans.append((track, name, start, end))

    def mark(self, track: str, name: str, args: dict | None = None) -> None:
        """An instant on ``track``, now (a verdict of a control point's, say)."""
        with self._lock:
            self._marks.append((track, name, time.perf_counter(), dict(args or {})))

    def module_forward(self, name: str, start: float, previous_ended: float) -> None:
        """Module ``name``'s forward pass starts at ``start``; the previous module's ended at
        ``previous_ended`` (on the training thread)."""
        self.forward_ended(previous_ended)
        self._forward = (name, start)

    def forward_ended(self, now: float) -> None:
        """Close the forward span of the module that ran last, if one is open."""
        if self._forward is not None:
            name, start = self._forward
            self.span("forward", name, start, now)
            self._forward = None

    def ready(self, round_index: int, name: str, at: float, backward_from: float) -> None:
        with self._lock:
            self._ready[(round_index, name)] = at
            self._spans.append(("backward", name, max(backward_from, self._last_ready), at))
            self._last_ready = at

    def on_exchange(self, kind: str, round: int, message: int, nbytes: int, at: float,
                    names: Sequence[str] = ()) -> None:
        with self._lock:
            if kind == "launch":
                self._launched[(round, message)] = (at, nbytes, tuple(names))
            else:
                start, size, tensors = self._launched.pop((round, message), (at, nbytes, ()))
                self._messages.append((round, message, tensors, size, start, at))

    def save(self, path: str) -> str:
        target = Path(path)
        target = target.with_name(f"{target.stem}.rank{self.rank}{target.suffix or '.json'}")
        trace = ChromeTrace()
        pid = self.rank
        trace.name_process(pid, f"rank {self.rank}", self.rank)
        for tid, label in _TRACKS.values():
            trace.name_thread(pid, tid, label)
        with self._lock:
            spans = list(self._spans)
            marks = list(self._marks)
            messages = sorted(self._messages, key=lambda m: m[4])
            ready = dict(self._ready)
        for track, name, start, end in spans:
            trace.complete(pid, _TRACKS[track][0], name, start - self.origin, end - start, track)
        for track, name, at, args in marks:
            trace.instant(pid, _TRACKS[track][0], name, at - self.origin, track, args)
        lanes = pack_lanes((start, end) for *_, start, end in messages)
        for lane in sorted(set(lanes)):
            trace.name_thread(pid, 10 + lane, f"all-reduce in flight {lane}")
        for (round_index, k, tensors, size, start, end), lane in zip(messages, lanes):
            label = f"r{round_index} m{k}: {tensors[0] if tensors else ''}" + (f" +{len(tensors) - 1}" if len(tensors) > 1 else "")
            args = {"bytes": size, "round": round_index, "tensors": list(tensors)}
            trace.complete(pid, 10 + lane, label, start - self.origin, end - start, "message", args)
            last_ready = max((ready.get((round_index, t), start) for t in tensors), default=start)
            if last_ready < start:
                trace.complete(pid, _TRACKS["queue"][0], label, last_ready - self.origin, start - last_ready, "queue",
                               args)
        trace.save(target)
        return str(target)
