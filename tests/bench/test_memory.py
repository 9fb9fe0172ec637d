"""gradsched.bench.memory.PeakMemory: what a stretch of work added to the process at its peak."""

from __future__ import annotations

import sys

import pytest
import torch

from gradsched.bench.memory import PeakMemory

MIB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's high-water mark reset is Linux's")
def test_a_peak_freed_before_the_end_counts_and_what_was_held_before_does_not():
    held = torch.ones(64 * MIB // 4)  # resident before the start: not the run's
    memory = PeakMemory()
    memory.start()
    peak = torch.ones(128 * MIB // 4)  # touched, then freed: the run's peak
    del peak
    small = torch.ones(MIB // 4)
    added = memory.stop()
    assert 120 * MIB <= added <= 170 * MIB, added / MIB
    memory.start()  # a second stretch starts from the memory as it is now
    assert memory.stop() < 16 * MIB
    del held, small
