"""The GPU check (benchmarks/gpu_check.py) on CPU: every part runs (gloo; the nccl part with NCCL's
completion semantics emulated) and every row judged there passes; its rows are written as each
part ends, and a budget too small for a part skips it; with a planted defect (tests/mutant) the
rows named for it fail: a consumer that skips its event wait, or a completion that takes a done
future for a reduced message, fails the nccl rows (and passes the reduction rows, on gloo); a
transport that does not reduce fails the reduction rows, a copy back whose future holds no tensor (no
CUDA event) fails the nccl part, a completion that resolves messages
before their results are in place fails those over a slow link. Asked for CUDA where there is
none, it says so and exits 2; its --help names the command for a lent GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bare.machine import bare_site

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def check(tmp_path, *args: str, mutant: str | None = None) -> tuple[int, list[dict]]:
    """The check's command on CPU; without a mutant, with only what the lent machine has (tests/bare:
    torch, what it requires, msgspec and the standard library; gradsched from src, as its command
    runs it there)."""
    out = tmp_path / "check.json"
    env, python = dict(os.environ), [sys.executable]
    if mutant is not None:
        env.update(GRADSCHED_MUTANT=mutant,
                   PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "mutant"), env.get("PYTHONPATH", "")]))
    else:
        env.update(PYTHONPATH=os.pathsep.join([str(bare_site(tmp_path / "bare")), str(ROOT / "src")]))
        python.append("-S")  # no site-packages (the processes it starts inherit the flag)
    done = subprocess.run([*python, str(SCRIPT), "--device", "cpu", "--quick", "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text())["rows"]


@pytest.mark.slow  # 22 s: CI runs it in the torch_range subset, on 2.11 (the lent machine's) and 2.14
@pytest.mark.torch_range
def test_the_cpu_version_of_the_gpu_check_passes(tmp_path):
    """With only torch, msgspec and the standard library importable; CI runs it on every torch of
    pyproject's range, the lent machine's (2.11) the floor."""
    code, rows = check(tmp_path)
    assert code == 0, [r for r in rows if r["ok"] is False]
    parts = [r["part"] for r in rows]
    assert list(dict.fromkeys(parts)) == ["nccl", "reduction", "streams", "handoff", "steady", "overlap", "sync_bn",
                                          "sharded", "end_to_end", "profile", "host_syncs", "overhead"]  # the order they run in
    judged = [r["check"] for r in rows if r["ok"] is True]
    assert sum(c.startswith("nccl") for c in judged) == 2 * 4 + 1  # bytescheduler, prophet: three checks and
    # the packed messages each, and fifo's packed messages (certain there)
    assert sum(c.startswith("reduction") for c in judged) == 3 * 2 + 2  # fp32 and fp16, and the slow link
    assert sum(c.startswith("handoff") for c in judged) == 2  # values, and the flat buffers freed
    assert sum(c.startswith("sharded") for c in judged) == 2 * 2  # both architectures, fifo and prophet
    assert sum(c.startswith("end_to_end") for c in judged) == 8 + 1
    assert len([r for r in rows if r["check"].startswith("overhead")]) == 5  # DDP and every policy
    assert [r["check"] for r in rows if r["check"].startswith("steady")]  # shown (judged on a GPU only)


@pytest.mark.parametrize("mutant, failing, passing", [
    pytest.param("skipped-wait", ("nccl",), ("reduction",), marks=pytest.mark.slow),
    pytest.param("done-is-reduced", ("nccl",), ("reduction",), marks=pytest.mark.slow),
    pytest.param("no-reduction", ("reduction fifo fp32", "reduction prophet fp32"), (), marks=pytest.mark.slow),
    pytest.param("early-resolve", ("reduction fifo over a slow link", "reduction prophet over a slow link"), (),
                 marks=pytest.mark.slow),
])  # CI: none here (15 s each); the nccl rows' two in test_nccl_semantics.py, no-reduction in test_mutant.py
def test_the_rows_named_for_a_planted_defect_fail(tmp_path, mutant, failing, passing):
    code, rows = check(tmp_path, "--parts", "nccl,reduction", mutant=mutant)
    assert code == 1
    named = [r for r in rows if r["check"].startswith(failing)]
    assert named and all(r["ok"] is False for r in named), rows
    unseen = [r for r in rows if r["check"].startswith(passing) and r["ok"] is not None] if passing else []
    assert all(r["ok"] for r in unseen), unseen  # on gloo a done future is a reduced one: invisible there


@pytest.mark.slow  # CI: the same mutant in test_nccl_semantics.py's equality tests
def test_a_copy_back_without_events_fails_the_nccl_part(tmp_path):
    """The packed messages (a float64 layer between float32 ones, in one of fifo's buckets)
    travel in copies: a copy back whose future holds no tensor records no CUDA event, and the
    emulation fails the part."""
    code, rows = check(tmp_path, "--parts", "nccl", mutant="copy-back-returns-nothing")
    assert code == 1
    assert [r for r in rows if r["check"] in ("nccl", "nccl fifo packed messages") and r["ok"] is False], rows


def test_each_part_is_written_as_it_ends_and_the_budget_skips_what_cannot_finish(tmp_path):
    code, rows = check(tmp_path, "--parts", "streams,overhead", "--budget", "60")
    assert code == 0
    assert [r["part"] for r in rows] == ["streams", "overhead"]
    assert rows[1]["ok"] is None and rows[1]["detail"].startswith("skipped: ")  # overhead may take 90 s


def test_the_help_names_the_one_command_for_a_lent_gpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 0
    assert "--no-index --no-deps --target /tmp/site .whl/*.whl" in done.stdout and "make gpu-wheels" in done.stdout
    assert "under 8" in done.stdout and all(part in done.stdout for part in ("nccl", "steady", "overhead"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no CUDA device" in done.stderr


@pytest.mark.slow  # 20 s; the GPU profile's CPU run, as the GPU check's is run above
def test_the_gpu_profile_runs_on_cpu_and_writes_what_it_says(tmp_path):
    """benchmarks/gpu_profile.py --device cpu: every case's iterations, the Python profile of each,
    and a trace per case in traces.tar.gz."""
    import tarfile

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--device", "cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "profile.json").read_text())
    cases = [f"overhead-{n}" for n in ("ddp", "fifo", "bytescheduler", "prophet")] + \
            [f"link-{n}" for n in ("ddp", "fifo", "bytescheduler")]
    assert [k for k in report if k != "setting"] == cases
    assert all(len(report[c]["iteration_ms"]) == 7 for c in cases[:4])
    assert report["link-bytescheduler"]["policy"] == "bytescheduler" and report["link-fifo"]["rounds"] > 0
    text = (tmp_path / "python-profile.txt").read_text()
    assert all(f"===== {c}:" in text for c in cases)
    with tarfile.open(tmp_path / "traces.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(f"trace-{c}.json" for c in cases)


def test_the_bare_interpreter_has_no_extras_and_the_check_needs_none_gone_in_python_3_12(tmp_path):
    """tests/bare has torch and msgspec and not numpy; and nothing the check imports
    (gradsched, benchmarks/gpucheck) is a module Python 3.12 removed (the lent machine's Python)."""
    import ast

    bare = str(bare_site(tmp_path / "bare"))
    done = subprocess.run([sys.executable, "-S", "-c", "import torch, msgspec, gradsched\ntry:\n    import numpy\n"
                           "except ModuleNotFoundError:\n    print('no numpy')"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([bare, str(ROOT / "src")])})
    assert done.returncode == 0 and done.stdout.strip() == "no numpy", done.stderr[-2000:]
    removed = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}  # gone in 3.12
    files = [*(ROOT / "src" / "gradsched").rglob("*.py"), *(ROOT / "benchmarks" / "gpucheck").glob("*.py"), SCRIPT]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), feature_version=(3, 11))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n.partition(".")[0] in removed]
    assert found == []
