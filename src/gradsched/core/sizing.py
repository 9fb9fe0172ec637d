"""Slice and credit sizes derived from the link and the model (``bytescheduler``'s defaults).

ByteScheduler's two knobs trade against each other through the link's per-message cost.
Every slice pays it once, so an iteration of ``G`` gradient bytes cut into slices of ``P``
pays it ``G / P`` times: the link's time spent on it grows as slices shrink. A slice in
flight cannot be overtaken, so the most urgent gradient may wait for up to a slice's link
time behind it (and the credit window's bytes beyond): that wait grows with ``P``. With a
per-message cost of ``c`` seconds and ``s`` seconds per payload byte, the two balance at

    P = sqrt(BALANCE * G * c / s)

(``c / s`` is the per-message cost in bytes of link time). ``c`` is the larger of the
link's per-message overhead and half its latency.

The window holds three slices. Measured on the emulated cluster (gloo over TCP, 2 ranks,
time-dilated K=3, the Transformer at batch 96, 5 Gbit/s: ``docs/bench.md``), the same
slices ran 631 ms per iteration in a window of one and a half slices, 585 in two and 580
in three (slices of half the size), against 564 for ``prophet``: a large slice alone on the
link leaves it idle between the phases of its all-reduce, which the next slice in the
window fills. With parameter servers three slices also let one slice's pull overlap the
next one's push (with one and a half, ResNet-152 on 4 workers ran 1.48x slower in the
simulator).

``BALANCE`` and the window were chosen in the simulator over ResNet-50, VGG-16 and the
Transformer at batches 32, 64 and 96, on 2 to 16 workers, per-message costs of 0 to 0.5 ms
and latencies of 20 us to 1 ms (27 settings, ``benchmarks/bytescheduler_sizes.py``), among
the windows the measurement allows: there the derived sizes put ``bytescheduler`` at most
1.1% behind ``prophet`` and 2.6% ahead on average, where the fixed 4 MiB slices and 16 MiB
window of the original were up to 12.5% behind. The result is rounded to a quarter of an
octave, so a drifting estimate does not re-cut the slices at every re-plan.

>>> mib = 1 << 20
>>> partition_for(100_000_000, seconds_per_byte=2.5e-9, overhead_s=110e-6, latency_s=200e-6) / mib
2.0
>>> credit_for(2 * mib) / mib
6.0
>>> partition_for(100_000_000, seconds_per_byte=0.0, overhead_s=0.0, latency_s=0.0) / mib  # nothing measured
4.0
"""

from __future__ import annotations

import math

KiB, MiB = 1 << 10, 1 << 20

BALANCE = 3.0  # per-message cost against the wait behind a slice (see the module docstring)
CREDIT_SLICES = 3  # the window, in slices
MIN_PARTITION = 256 * KiB  # below this, a slice's bookkeeping costs more than its urgency saves
MAX_PARTITION = 64 * MiB
UNMEASURED_PARTITION = 4 * MiB  # before anything is measured (the original's fixed size)


def partition_for(total_bytes: int, seconds_per_byte: float, overhead_s: float, latency_s: float) -> int:
    """The slice size for a model of ``total_bytes`` of gradients on this link (see the module
    docstring); :data:`UNMEASURED_PARTITION` where the link's cost per byte is unknown (0)."""
    if total_bytes < 0 or seconds_per_byte < 0 or overhead_s < 0 or latency_s < 0:
        raise ValueError(
            f"sizes and times must be >= 0, got total_bytes={total_bytes}, seconds_per_byte={seconds_per_byte}, "
            f"overhead_s={overhead_s}, latency_s={latency_s}"
        )
    if seconds_per_byte == 0 or total_bytes == 0:
        return UNMEASURED_PARTITION
    per_message = max(overhead_s, latency_s / 2) / seconds_per_byte  # in bytes of link time
    exact = math.sqrt(BALANCE * total_bytes * per_message)
    rounded = 2.0 ** (round(4 * math.log2(max(exact, 1.0))) / 4)  # a quarter octave
    return int(min(MAX_PARTITION, max(MIN_PARTITION, rounded)))


def credit_for(partition_bytes: int) -> int:
    """The credit window for slices of ``partition_bytes``."""
    return CREDIT_SLICES * partition_bytes
