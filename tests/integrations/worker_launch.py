"""Run an integration worker on 2 gloo ranks and read the report rank 0 wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch import run_ranks  # noqa: E402

HERE = Path(__file__).resolve().parent


def run_worker(script: str, tmp_path: Path) -> dict:
    out = tmp_path / "out.json"
    for r in run_ranks(str(HERE / script), 2, str(out), str(tmp_path), timeout=600):
        assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())
