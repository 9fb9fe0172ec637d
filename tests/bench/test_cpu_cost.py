"""The CPU cost benchmark (benchmarks/cpu_cost.py): what it counts as whose."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("cpu_cost", ROOT / "benchmarks" / "cpu_cost.py")
cpu_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_cost)


def test_each_threads_cpu_time_is_counted_under_its_name_and_blocked_time_is_not():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    busy = [threading.Thread(target=spin, name=f"gradsched-spinner-{i}") for i in range(2)]
    idle = threading.Thread(target=stop.wait, name="gradsched-idle")
    for thread in (*busy, idle):
        thread.start()
    try:
        before = cpu_cost.thread_cpu()
        deadline = time.monotonic() + 30.0  # however busy the machine's cores are with others' work
        while True:
            time.sleep(0.05)
            after = cpu_cost.thread_cpu()
            if after["gradsched-spinner"] - before.get("gradsched-spinner", 0.0) > 0.1 or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        for thread in (*busy, idle):
            thread.join()
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    # two spinners (their numbers dropped: one name) share the interpreter with the main thread, which sleeps
    # between looks: it and the blocked thread spend next to nothing
    assert spent["gradsched-spinner"] > 0.1
    assert spent["gradsched-idle"] < 0.02 and spent["training"] < 0.05


def test_own_time_is_the_training_threads_and_gradscheds_not_the_others():
    median = {"wall": 1.0, "process": 0.9, "thread:training": 0.2, "thread:gradsched-launcher": 0.1,
              "thread:someone-else": 0.3}
    assert cpu_cost.own(median) == pytest.approx(0.3)


@pytest.mark.slow
def test_a_short_run_writes_its_json_and_table(tmp_path):
    out = tmp_path / "cpu.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_cost.py"), "--model", "replay-mini",
                          "--iters", "4", "--warmup", "4", "--policies", "ddp,fifo", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert set(data["result"]["policies"]) == {"ddp", "fifo"}
    assert cpu_cost.table(data) == run.stdout
    fifo = data["result"]["policies"]["fifo"]["median"]
    assert fifo["process"] > fifo["thread:training"] > 0 and "thread:gradsched-launcher" in fifo


def test_the_table_shows_the_launch_work_where_the_run_had_a_launch_share():
    median = {"wall": 0.1, "process": 0.09, "thread:training": 0.03, "thread:gradsched-launcher": 0.01,
              "launch:cpu": 0.005, "launch:wall": 0.012, "launch:interpreter": 0.004, "launch:blocked": 6}
    data = {"args": {"ranks": 2, "model": "replay-resnet50", "device": "h100", "batch": 32, "launch_share": 0.3},
            "result": {"compute_s": 0.014, "policies": {
                "prophet": {"median": median, "tensors": 161, "messages": 70, "plan": "prophet", "iterations": 16}}}}
    text = cpu_cost.table(data)
    assert "launched by CPU work of 30% of its time" in text
    assert text.splitlines()[-1].split() == ["prophet", "5.0", "12.0", "4.00", "6", "100.0"]
    del median["launch:cpu"]
    assert "launched by" not in cpu_cost.table(data)  # a run without a launch share: no such columns


def test_the_bytes_sent_in_copies_get_a_column_where_the_run_counted_them():
    def data(copied: bool) -> dict:
        median = {"wall": 0.1, "process": 0.09, "thread:training": 0.03, "thread:gradsched-launcher": 0.01}
        policies = {name: {"median": dict(median, **({"copied_bytes": 42e6 if name == "prophet" else 0}
                                                   if copied else {})),
                           "tensors": 161, "messages": None if name == "ddp" else 70, "plan": name, "iterations": 16}
                    for name in ("ddp", "prophet")}
        return {"args": {"ranks": 2, "model": "replay-resnet50", "device": "h100", "batch": 32, "launch_share": 0.0},
                "result": {"compute_s": 0.014, "policies": policies}}

    counted = cpu_cost.table(data(True)).splitlines()
    assert "copied MB" in counted[1]
    assert counted[2].split()[-2:] == ["-", "ddp"]  # DDP's reducer copies in C++: not counted
    assert counted[3].split()[-4] == "42.0"  # before "prophet, 70 messages"
    assert "copied MB" not in cpu_cost.table(data(False))  # kept before the column was
