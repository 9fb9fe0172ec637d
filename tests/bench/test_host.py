"""The host CPU load the bench reports next to each row."""

from __future__ import annotations

import os
import time

import pytest

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


def test_the_host_is_at_least_as_busy_as_this_process_under_any_load():
    """This process's own CPU time is part of the host's busy time, whatever else runs."""
    cpu = HostCpu()
    cpu.start()
    wall, own = time.perf_counter(), time.process_time()
    end = wall + 0.3
    while time.perf_counter() < end:
        pass
    wall, own = time.perf_counter() - wall, time.process_time() - own
    cpu.stop()
    cores = os.cpu_count() or 1
    assert own / (wall * cores) * 0.9 <= cpu.busy <= 1.0


@pytest.mark.slow  # asserts the host idle: only on a quiet host (the test above holds under load)
def test_a_sleeping_thread_leaves_the_host_idle():
    cpu = HostCpu()
    cpu.start()
    time.sleep(0.5)
    cpu.stop()
    assert 0.0 <= cpu.busy < 0.5  # nothing else is meant to run beside the tests
