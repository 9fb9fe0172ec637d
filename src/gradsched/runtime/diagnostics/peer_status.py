"""How far each rank got: what a rank whose communication failed learns from the others.

When a collective fails or times out, the rank that sees it cannot tell why: a peer died,
was stopped, or is somewhere else in its script because it ran out of batches (uneven
inputs). The ranks share one place that outlives a collective gone wrong: the key-value
store every rank reached in ``init_process_group``. gradsched uses it only when something
ends or fails, never per iteration:

* a rank that closes gradsched (``close()``, or at the normal end of its process) writes how
  many backward passes it ran;
* a rank whose communication failed raises an *alarm* and waits a few seconds for answers;
  every other live rank has a watcher thread that looks at the store once a second and
  answers with its backward pass, its state (training, joined, closed) and how long ago its
  latest forward pass began;
* the failing rank's error then says what each rank reported, and names uneven inputs when a
  rank stopped earlier than this one.

The store is a clone of the default process group's (its own connection, with a short
timeout); where there is none (``init_process_group(store=...)`` without one, one rank), the
errors say nothing more.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Protocol, Sequence

import torch
import torch.distributed as dist

STORE_TIMEOUT_S = 5.0  # a store that does not answer within this is taken as gone
POLL_S = 1.0  # how often a watcher looks for an alarm
ANSWER_S = 3.0  # how long a failing rank waits for the others' answers
IDLE_S = 2.0  # a rank behind this one whose forward pass began longer ago has stopped training
_RUNNING: weakref.WeakSet = weakref.WeakSet()  # every PeerStatus whose watcher may still run (stop_all)


@dataclass
class Status:
    """One rank's progress, as it reports it."""

    round: int  # the backward pass it is in or heading to (its forward pass began); closed: how many ran
    state: str  # "training", "joined" (shadowing the others in join()) or "closed"
    since_s: float  # since its latest forward pass began (or it closed)


class Progress(Protocol):
    """How far this rank got, as the run's rounds say (:class:`gradsched.runtime.training.lifecycle.RoundLife`)."""

    index: int  # the latest round opened
    in_forward: bool  # a forward pass ran and its backward pass handed nothing over yet
    active_at: float  # when the latest forward pass began (or the rank closed), on time.monotonic
    joined: bool
    closed: bool


def status_of(progress: Progress) -> Status:
    """This rank's report, from its rounds."""
    state = "closed" if progress.closed else "joined" if progress.joined else "training"
    began = progress.in_forward and state == "training"  # a forward pass
    return Status(progress.index + int(began), state, time.monotonic() - progress.active_at)


class PeerStatus:
    """One wrap's reports and watcher (see the module's docstring), reading ``progress``."""

    def __init__(self, rank: int, ranks: Sequence[int], progress: Progress,
                 group: dist.ProcessGroup | None) -> None:
        self.rank = rank
        self.peers = [r for r in ranks if r != rank]
        self.progress = progress
        self.store = _job_store() if self.peers else None
        # from the OS, not torch's generator: the user's random stream stays as DDP leaves it
        token = torch.tensor([int.from_bytes(os.urandom(7), "big")], dtype=torch.int64)
        if self.peers:  # a key space of this wrap alone, also across restarts and re-wraps
            dist.broadcast(token, group_src=min(ranks), group=group)
        self.prefix = f"gradsched/progress/{token.item()}/"
        self._stop = threading.Event()
        self._thread = None
        self._explained: str | None = None
        if self.store is not None:
            self._thread = threading.Thread(target=self._watch, name="gradsched-peer-status", daemon=True)
            self._thread.start()
            _RUNNING.add(self)

    def status(self) -> Status:
        return status_of(self.progress)

    # -- every rank ------------------------------------------------------------------------
    def _watch(self) -> None:
        alarm = self.prefix + "alarm"
        while not self._stop.wait(POLL_S):  # until closed
            try:
                if self.store.check([alarm]):
                    self._report(self.status())
                    return
            except Exception:  # noqa: BLE001 - the store went away: nobody asks any more
                return

    def _report(self, status: Status) -> None:
        self.store.set(f"{self.prefix}rank{self.rank}", json.dumps(asdict(status)))

    def close(self) -> None:
        """This rank is done: leave the final report (for peers that fail later) and stop watching."""
        self._stop.set()
        if self.store is not None:
            try:
                self._report(self.status())
            except Exception:  # noqa: BLE001 - best effort: the store may be gone
                pass
        self.stop()

    def stop(self) -> None:
        """Stop the watcher and wait for it: a thread inside a store call when the interpreter
        finalizes is ended in C++ code, which aborts the process."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=STORE_TIMEOUT_S + POLL_S)
        _RUNNING.discard(self)


    # -- a rank whose communication failed -------------------------------------------------
    def explain(self) -> str:
        """What the other ranks report (asking them first), and the likely cause; "" when
        nothing can be learned."""
        if self.store is None:
            return ""
        if self._explained is None:  # asked once: later errors of the same failure repeat the answer
            mine = self.status()
            try:
                self.store.set(self.prefix + "alarm", str(self.rank))
                reports = self._collect()
            except Exception as exc:  # noqa: BLE001
                self._explained = (f" (the ranks' progress is unknown: the job's store did not answer: {exc}; the "
                                   "process hosting it has ended: torchrun's agent, or rank 0 where the job was "
                                   "started without torchrun)")
            else:
                self._explained = describe(self.rank, mine, {r: reports.get(r) for r in self.peers})
        return self._explained

    def _collect(self) -> dict[int, Status]:
        keys = {r: f"{self.prefix}rank{r}" for r in self.peers}
        reports: dict[int, Status] = {}
        deadline = time.monotonic() + ANSWER_S
        while True:
            for r, key in keys.items():
                if r not in reports and self.store.check([key]):
                    reports[r] = Status(**json.loads(self.store.get(key)))
            if len(reports) == len(keys) or time.monotonic() > deadline:
                return reports
            time.sleep(0.1)


def describe(rank: int, mine: Status, reports: dict[int, Status | None]) -> str:
    """The paragraph added to a communication error on ``rank``.

    >>> print(describe(1, Status(38, "training", 0.1), {0: Status(37, "closed", 2.0)}).strip())
    Ranks' progress: this rank (1) is in backward pass 38; rank 0 closed gradsched after 37 backward passes.
    Rank 0 stopped after fewer backward passes than this rank: it ran out of inputs (the ranks' inputs are uneven) or is stuck outside gradsched. For uneven inputs, give every rank the same number of batches (e.g. DistributedSampler(..., drop_last=True)), or train inside `with model.join():` (gradsched.DistributedDataParallel) or `with optimizer.join():` (gradsched.wrap).
    """
    parts = [f"this rank ({rank}) is in backward pass {mine.round}"]
    behind = []
    for r, status in sorted(reports.items()):
        if status is None:
            parts.append(f"rank {r} did not answer (its process ended, was killed or is stopped)")
            continue
        if status.state == "closed":
            parts.append(f"rank {r} closed gradsched after {status.round} backward passes")
        elif status.state == "joined":
            parts.append(f"rank {r} has joined (ran out of inputs inside join()) after {status.round} backward passes")
        else:
            parts.append(f"rank {r} is at backward pass {status.round}, its latest forward pass began "
                         f"{status.since_s:.0f} s ago")
        if status.round < mine.round and (status.state == "closed" or
                                          (status.state == "training" and status.since_s >= IDLE_S)):
            behind.append(r)
    text = "\nRanks' progress: " + "; ".join(parts) + "."
    if behind:
        who = " and ".join(f"rank {r}" for r in behind)
        text += (f"\n{who[0].upper()}{who[1:]} stopped after fewer backward passes than this rank: it ran out of "
                 "inputs (the ranks' inputs are uneven) or is stuck outside gradsched. For uneven inputs, give every "
                 "rank the same number of batches (e.g. DistributedSampler(..., drop_last=True)), or train inside "
                 "`with model.join():` (gradsched.DistributedDataParallel) or `with optimizer.join():` "
                 "(gradsched.wrap).")
    return text


def _job_store() -> Any:
    """A clone of the default process group's store (its own connection) with a short
    timeout, or None."""
    try:
        from gradsched.runtime.torch_private import default_store

        store = default_store().clone()
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        return store
    except Exception:  # noqa: BLE001 - no default group, or a store that cannot be cloned
        return None


def stop_all() -> None:
    """Stop every watcher (at exit, for coordinators never closed)."""
    for peers in list(_RUNNING):
        peers.stop()
