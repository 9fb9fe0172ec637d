"""How much memory one run of the bench takes on its rank at its peak.

On CPU, the figure is the process's resident set's high-water mark over the run, above its
size when the run began. Before each run the memory of the ones before is handed back
(garbage collected, glibc's free lists trimmed), the kernel's high-water mark is reset to
the current resident size (``5`` written to ``/proc/self/clear_refs``) and that size noted;
after it, the high-water mark (``VmHWM`` in ``/proc/self/status``) less that size is what the
run added at its peak: the model, its gradients, the optimizer's state and every buffer the
wrapper (DDP's buckets, gradsched's packed messages, FSDP2's gathered layers) held at once.
It is a measurement, not an account: pages the allocator keeps count, and memory a run
reuses from before its start does not. Where the kernel does not offer the reset (not
Linux) the figure is None.

:class:`HeapPeak` counts allocations instead of pages: the most bytes the allocator had
handed out at once (glibc's own count, sampled), which the allocator's free lists and its
fragmentation do not change: the steadier figure of the two, the one to compare arms by.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from typing import Callable


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim() -> None:
    """Hand freed memory back to the kernel (glibc's ``malloc_trim``; nothing elsewhere)."""
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


class PeakMemory:
    """``start()``, the run, ``stop()``: the bytes the run added to this process at its peak."""

    def __init__(self) -> None:
        self._base_kib: int | None = None

    def start(self) -> None:
        gc.collect()
        _trim()
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
        except OSError:
            self._base_kib = None
            return
        self._base_kib = _status_kib("VmRSS")

    def stop(self) -> int | None:
        peak = _status_kib("VmHWM")
        if self._base_kib is None or peak is None:
            return None
        return max(0, peak - self._base_kib) * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> Callable[[], int] | None:
    """glibc's count of the bytes its allocator has handed out and not had back (every arena's
    ``uordblks`` plus the chunks it mapped whole, ``hblkhd``); None without glibc's mallinfo2."""
    try:
        mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    mallinfo2.restype = _MallInfo2

    def in_use() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd

    return in_use


class HeapPeak:
    """``start()``, the run, ``stop()``: the most bytes the run had allocated at once above what
    was allocated when it began, from the allocator's own count (not pages: what the allocator
    keeps free does not count), sampled every ``interval_s`` by a thread of its own, so a peak
    shorter than that can be missed. None where glibc's count is not available."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self.interval_s = interval_s
        self._in_use = _heap_in_use()
        self._base = self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._in_use is None:
            return
        gc.collect()
        self._base = self._peak = self._in_use()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="heap-peak", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, self._in_use())

    def stop(self) -> int | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        return max(self._peak, self._in_use()) - self._base


class RunMemory:
    """Both figures of one run: ``start()``, then ``stop()`` once its training is over (before a
    wrapper is closed: fully sharded's close gathers every parameter whole again, which is
    leaving, not training; FSDP2's full parameters are likewise joined after the figure);
    later calls of ``stop()`` return the first one's figures."""

    def __init__(self) -> None:
        self.resident, self.heap = PeakMemory(), HeapPeak()
        self._figures: dict | None = None

    def start(self) -> None:
        self._figures = None
        self.resident.start()
        self.heap.start()

    def stop(self) -> dict:
        """``{"peak_memory_bytes": resident high-water added, "peak_allocated_bytes": allocated at most}``."""
        if self._figures is None:
            self._figures = {"peak_memory_bytes": self.resident.stop(), "peak_allocated_bytes": self.heap.stop()}
        return self._figures
