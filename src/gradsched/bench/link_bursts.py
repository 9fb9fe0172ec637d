"""A straggler's link slowed in bursts by the clock (``--straggler RANK:FACTOR:link:burst=S/P``
with durations): the launcher, which owns the emulated network, slows the rank's link (both of
its ends) for ``slow_s`` of every ``period_s`` seconds, times the dilation K, from before the
ranks start until they end.

By the clock and not by the rank's steps: another tenant's traffic on a shared NIC does not wait
for our iterations, and a switch tied to steps would favour schedules whose steps end before
their communication does (what is left of a slow step's traffic would move at the next, fast
step's rate). By the clock every schedule's bytes meet the slow rate for the same share of the
time, so the link's capacity averaged over the clock (``Straggler.rate_share``) bounds them all
alike; the rows, means over their timed iterations, then differ from a whole number of periods'
by at most the part of one period their window cuts (``periods`` in the bench's JSON says how
many each covered).

Each change is ``tc qdisc change`` on both ends (about 6 ms, kept in :attr:`LinkSwitch.changes`),
the buckets keeping the fast rate's depth (gradsched.bench.netns.EmulatedCluster.set_slower).
"""

from __future__ import annotations

import threading
import time

from .netns import EmulatedCluster
from .straggler import Straggler


class LinkSwitch:
    """``with LinkSwitch(cluster, straggler, dilation, host):`` the straggler's link (its ``host``'s,
    by default host ``straggler.rank``: one rank per host) slow, then fast, by the clock, until the
    block ends (then fast). ``changes`` keeps (slow?, when it began, seconds
    the reshaping took) of each change; ``errors`` what failed (the launcher then fails the run)."""

    def __init__(self, cluster: EmulatedCluster, straggler: Straggler, dilation: float = 1.0,
                 host: int | None = None) -> None:
        if not straggler.link_bursts:
            raise ValueError(f"a LinkSwitch is for a link slowed in bursts, not {straggler.describe()!r}")
        if not dilation > 0:
            raise ValueError(f"dilation must be > 0, got {dilation}")
        self.cluster, self.straggler = cluster, straggler
        self.host = straggler.rank if host is None else host
        self.slow_s, self.fast_s = straggler.slow_s * dilation, (straggler.period_s - straggler.slow_s) * dilation
        self.changes: list[tuple[bool, float, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._switch, name="gradsched-link-bursts", daemon=True)

    def __enter__(self) -> LinkSwitch:
        self._thread.start()
        return self

    def _set(self, slow: bool) -> bool:
        start = time.perf_counter()
        try:
            self.cluster.set_slower(self.host, self.straggler.factor if slow else 1.0)
        except Exception as exc:  # said by the launcher after the run, which then fails
            self.errors.append(str(exc))
            return False
        self.changes.append((slow, start, time.perf_counter() - start))
        return True

    def _switch(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            for slow, lasting in ((True, self.slow_s), (False, self.fast_s)):
                if not self._set(slow):
                    return
                due += lasting  # by the clock: the time a change takes is not added to the period
                if self._stop.wait(max(0.0, due - time.perf_counter())):
                    return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if not self.changes or self.changes[-1][0]:
            self._set(False)  # fast again: the cluster may be measured further
