"""Chrome trace of a real run on one rank: forward waits, updates, gradients, messages."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..trace import ChromeTrace, pack_lanes


class RunTrace:
    """Collects events with ``time.perf_counter`` stamps; thread-safe; written by ``save``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.origin = time.perf_counter()
        self._lock = threading.Lock()
        self._spans: list[tuple[str, str, float, float]] = []  # (track, name, start, end)
        self._instants: list[tuple[str, str, float]] = []
        self._launched: dict[tuple[int, int], tuple[float, int]] = {}
        self._messages: list[tuple[str, float, float, int]] = []

    def span(self, track: str, name: str, start: float, end: float) -> None:
        with self._lock:
            self._spans.append((track, name, start, end))

    def instant(self, track: str, name: str, at: float) -> None:
        with self._lock:
            self._instants.append((track, name, at))

    def on_exchange(self, kind: str, round: int, message: int, nbytes: int, at: float) -> None:
        with self._lock:
            if kind == "launch":
                self._launched[(round, message)] = (at, nbytes)
            else:
                start, _ = self._launched.pop((round, message), (at, nbytes))
                self._messages.append((f"round {round} message {message}", start, at, nbytes))

    def save(self, path: str) -> str:
        target = Path(path)
        target = target.with_name(f"{target.stem}.rank{self.rank}{target.suffix or '.json'}")
        trace = ChromeTrace()
        trace.name_process(self.rank, f"rank {self.rank}", self.rank)
        tracks = {"wait": 1, "update": 2, "ready": 3}
        for name, tid in tracks.items():
            trace.name_thread(self.rank, tid, {"wait": "forward waits for updates", "update": "optimizer updates",
                                               "ready": "gradients ready"}[name])
        with self._lock:
            for track, name, start, end in self._spans:
                trace.complete(self.rank, tracks[track], name, start - self.origin, end - start, track)
            for track, name, at in self._instants:
                trace.instant(self.rank, tracks[track], name, at - self.origin, track)
            messages = sorted(self._messages, key=lambda m: m[1])
        lanes = pack_lanes((start, end) for _, start, end, _ in messages)
        for lane in sorted(set(lanes)):
            trace.name_thread(self.rank, 10 + lane, f"all-reduce in flight {lane}")
        for (name, start, end, nbytes), lane in zip(messages, lanes):
            trace.complete(self.rank, 10 + lane, name, start - self.origin, end - start, "message", {"bytes": nbytes})
        trace.save(target)
        return str(target)
