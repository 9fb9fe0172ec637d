"""The host CPU load the bench reports next to each row."""

from __future__ import annotations

import os
import time

from gradsched.bench.host import HostCpu


def test_a_busy_thread_shows_as_one_cpu_of_the_host():
    cpu = HostCpu()
    assert cpu.busy is None
    cpu.start()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # one thread spinning: one CPU of the host busy
        pass
    cpu.stop()
    cores = os.cpu_count() or 1
    assert 0.7 / cores < cpu.busy <= 1.0


def test_a_sleeping_thread_leaves_the_host_idle():
    cpu = HostCpu()
    cpu.start()
    time.sleep(0.5)
    cpu.stop()
    assert 0.0 <= cpu.busy < 0.5  # nothing else is meant to run beside the tests
