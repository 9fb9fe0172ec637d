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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


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
