"""The architecture stays visible: a torch-free core, small modules."""

import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "gradsched"


def test_core_and_simulator_do_not_import_torch_or_threads():
    code = (
        "import sys, gradsched.core, gradsched.sim, gradsched.sim.compare, gradsched.models.table;"
        "bad = sorted(m for m in ('torch', 'threading', 'asyncio') if m in sys.modules and m != 'threading');"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    for path in (SRC / "core").rglob("*.py"):
        text = path.read_text()
        for word in ("import torch", "import threading", "time.time", "perf_counter", "import random"):
            assert word not in text, f"{path.name} uses {word}"


def test_modules_stay_small():
    for path in SRC.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= 500, f"{path.relative_to(SRC)} has {lines} lines: split it"
