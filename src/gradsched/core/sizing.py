"""Slice and credit sizes derived from the link and the model (``bytescheduler``'s defaults).

ByteScheduler's two knobs trade against each other through the link's per-message cost.
Every slice pays it once, so an iteration of ``G`` gradient bytes cut into slices of ``P``
pays it ``G / P`` times: the link's time spent on it grows as slices shrink. A slice in
flight cannot be overtaken, so the most urgent gradient may wait for up to a slice's link
time behind it (and the credit window's bytes beyond): that wait grows with ``P``. With a
per-message cost of ``c`` seconds and ``s`` seconds per payload byte, the two balance at

    P = sqrt(BALANCE * G * c / s)

(``c / s`` is the per-message cost in bytes of link time). ``c`` is the larger of the
link's per-message overhead and half its latency. The window holds three slices and at most
an eighth of the model's gradient bytes (``WINDOW_SHARE``): the most urgent gradient waits
behind at most that share of a round's communication, however costly the link's messages
measure. The slice is at most 8 MiB. These constants were chosen by
measurement on the emulated cluster (gloo over TCP, 2 ranks, time-dilated K=3, at the
balance points; ``docs/bench.md``, "bytescheduler's derived sizes"), where the simulator's
link is too kind to small slices, to lone slices and to large windows:

* a large slice alone on the link leaves it idle between the phases of its all-reduce, which
  the next slice in the window fills: the Transformer at batch 96 ran 631 ms per iteration
  with a window of one and a half slices of 9.5 MiB, 585 with two, 589 with three of 8 MiB
  (prophet 564-580), though the simulator finds one and a half the better window;
* each message costs the runtime more than the link's measured per-message overhead: with
  ``BALANCE`` = 1 (2.4 MiB slices) ResNet-50 at batch 96 ran 339 ms, with 3 (4 MiB) 286-299
  (prophet 285-289);
* a window of large slices keeps the urgent gradients of the next forward pass waiting:
  VGG-16 at batch 96 ran 938 ms with three slices of 13.5 MiB, 878 with three of 8 MiB
  (prophet 820-847);
* the window's share of the model matters where the model is small: over six runs of
  ResNet-50 (97 MiB) at batch 96, with the link's per-message cost as each run probed it,
  4 MiB slices ran 1.01-1.02x prophet's time, 4.8-6.7 MiB slices (a window of 15-21% of
  the model) 1.06-1.09x in three of four runs.

With parameter servers three slices also let one slice's pull overlap the next one's push.
The result is rounded to a quarter of an octave, so a drifting estimate does not re-cut the
slices at every re-plan. ``benchmarks/bytescheduler_sizes.py`` compares these sizes with the
original's in the simulator.

>>> mib = 1 << 20
>>> round(partition_for(100_000_000, seconds_per_byte=2.5e-9, overhead_s=110e-6, latency_s=200e-6) / mib, 2)
3.36
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
MAX_PARTITION = 8 * MiB  # above this, urgent slices wait behind the window longer than the messages saved
WINDOW_SHARE = 1 / 8  # the window holds at most this share of the model's gradient bytes
UNMEASURED_PARTITION = 4 * MiB  # before anything is measured (the original's fixed size)


def partition_for(total_bytes: int, seconds_per_byte: float, overhead_s: float, latency_s: float) -> int:
    """The slice size for a model of ``total_bytes`` of gradients on this link (see the module
    docstring): the square-root law, its window at most :data:`WINDOW_SHARE` of the model,
    rounded to a quarter octave and held between the bounds; :data:`UNMEASURED_PARTITION`
    where the link's cost per byte is unknown (0)."""
    if total_bytes < 0 or seconds_per_byte < 0 or overhead_s < 0 or latency_s < 0:
        raise ValueError(
            f"sizes and times must be >= 0, got total_bytes={total_bytes}, seconds_per_byte={seconds_per_byte}, "
            f"overhead_s={overhead_s}, latency_s={latency_s}"
        )
    if seconds_per_byte == 0 or total_bytes == 0:
        return UNMEASURED_PARTITION
    per_message = max(overhead_s, latency_s / 2) / seconds_per_byte  # in bytes of link time
    exact = min(math.sqrt(BALANCE * total_bytes * per_message), WINDOW_SHARE * total_bytes / CREDIT_SLICES)
    rounded = 2.0 ** (round(4 * math.log2(max(exact, 1.0))) / 4)  # a quarter octave
    return int(min(MAX_PARTITION, max(MIN_PARTITION, rounded)))


def credit_for(partition_bytes: int) -> int:
    """The credit window for slices of ``partition_bytes``."""
    return CREDIT_SLICES * partition_bytes
