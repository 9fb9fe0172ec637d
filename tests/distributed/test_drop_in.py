"""gradsched in DDP's place: a script written for DDP (ddp_script.py) runs with its DDP import
replaced by gradsched's, and ends with DDP's parameters for every policy (2 gloo ranks),
with AMP's GradScaler and global-norm clipping read from gradients still on the wire; DDP
checkpoints resume under gradsched and the other way round.

Tolerance: 1e-5 absolute (parameters move by about 1e-1 over these runs).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import torch

from workers.launch import HERE, run_ranks

TOLERANCE = 1e-5
POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
DDP_IMPORT = "from torch.nn.parallel import DistributedDataParallel as DDP"
OURS = "from gradsched import DistributedDataParallel as DDP"


CLIPPING = {  # torch's clipping line -> gradsched's (the one documented line that may differ)
    "torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)": "model.clip_grad_norm_(args.clip)",
    "torch.nn.utils.clip_grad_value_(model.parameters(), args.clip_value)": "model.clip_grad_value_(args.clip_value)",
}


def switched(tmp_path: Path, name: str, replace: dict[str, str]) -> Path:
    """workers/ddp_script.py with exactly the lines in ``replace`` changed, written to ``tmp_path``."""
    text = (HERE / "ddp_script.py").read_text()
    ours = text
    for old, new in replace.items():
        assert text.count(old) == 1, old
        ours = ours.replace(old, new)
    changed = [line for line in difflib.unified_diff(text.splitlines(), ours.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == 2 * len(replace)
    path = tmp_path / f"switched_{name}.py"
    path.write_text(ours)
    return path


def train(script: str, out: Path, *args: str, policy: str | None = None) -> dict[str, torch.Tensor]:
    results = run_ranks(script, 2, str(out), *args, timeout=180, env={"GRADSCHED_POLICY": policy} if policy else None)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(out)


def differences(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().nan_to_num(float("inf")).max().item() for k in a)


@pytest.fixture
def gradsched_script(tmp_path):
    return str(switched(tmp_path, "import", {DDP_IMPORT: OURS}))


@pytest.fixture
def gradsched_clipping_script(tmp_path):
    return str(switched(tmp_path, "clipping", {DDP_IMPORT: OURS, **CLIPPING}))


@pytest.mark.parametrize("extra", [pytest.param((), marks=pytest.mark.slow), ("--amp", "--clip", "0.05")],
                         ids=["plain", "amp-clip"])  # CI: the harder one
def test_a_ddp_script_switched_in_one_line_equals_ddp(tmp_path, gradsched_script, extra):
    reference = train("ddp_script", tmp_path / "ddp.pt", *extra)
    start = train("ddp_script", tmp_path / "none.pt", *extra, "--steps", "0")
    moved = differences(reference, start)
    assert moved > 5e-2
    for policy in POLICIES:
        ours = train(gradsched_script, tmp_path / f"{policy}.pt", *extra, policy=policy)
        assert differences(ours, reference) <= TOLERANCE, policy


def test_checkpoints_move_between_ddp_and_gradsched(tmp_path, gradsched_script):
    """A DDP checkpoint (keys with ``module.``) resumes under gradsched, and a gradsched one
    under DDP; both end where the uninterrupted DDP run ends."""
    reference = train("ddp_script", tmp_path / "ddp.pt", "--amp", "--clip", "0.05")
    ddp_ckpt, our_ckpt = tmp_path / "ddp-ckpt.pt", tmp_path / "our-ckpt.pt"
    train("ddp_script", tmp_path / "half.pt", "--amp", "--clip", "0.05", "--save-at", "3", str(ddp_ckpt))
    resumed = train(gradsched_script, tmp_path / "resumed.pt", "--amp", "--clip", "0.05", "--resume", str(ddp_ckpt),
                    policy="prophet")
    assert differences(resumed, reference) <= TOLERANCE
    ours = train(gradsched_script, tmp_path / "ours.pt", "--amp", "--clip", "0.05", "--save-at", "5", str(our_ckpt),
                 policy="bytescheduler")
    assert differences(ours, reference) <= TOLERANCE
    assert all(k.startswith("module.") for k in torch.load(our_ckpt)["model"])
    back = train("ddp_script", tmp_path / "back.pt", "--amp", "--clip", "0.05", "--resume", str(our_ckpt))
    assert differences(back, reference) <= TOLERANCE


@pytest.mark.parametrize("extra", [("--clip", "0.05"), pytest.param(("--clip-value", "0.002"), marks=pytest.mark.slow)],
                         ids=["norm", "value"])  # CI: the one that waits for every reduction
def test_gradscheds_clipping_calls_equal_torchs_under_ddp(tmp_path, gradsched_clipping_script, extra):
    """model.clip_grad_norm_ (waits for every reduction) and model.clip_grad_value_ (waits for
    none: each gradient is clamped once reduced) in place of torch's, with AMP."""
    reference = train("ddp_script", tmp_path / "ddp.pt", "--amp", *extra)
    unclipped = train("ddp_script", tmp_path / "unclipped.pt", "--amp")
    assert differences(reference, unclipped) > 1e-2  # the clipping bites
    for policy in ("fifo", "prophet"):
        ours = train(gradsched_clipping_script, tmp_path / f"{policy}.pt", "--amp", *extra, policy=policy)
        assert differences(ours, reference) <= TOLERANCE, policy


@pytest.mark.parametrize("policies", [
    pytest.param(POLICIES, marks=pytest.mark.slow),  # CI: the first and the last, below
    ("fifo", "prophet")], ids=["every-policy", "fifo-prophet"])
def test_a_compiled_model_equals_ddp_with_compile(tmp_path, policies):
    """torch.compile (aot_eager: dynamo and AOT autograd, without codegen, to stay fast here)
    before and after the wrap, each policy, against DDP + compile: equal within TOLERANCE."""
    import json

    out = tmp_path / "out.json"
    for r in run_ranks("compiled", 2, str(out), "--policies", ",".join(policies), timeout=300):
        assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["moved"] > 1e-2
    assert len(report["cases"]) == 2 * len(policies)
    for case, difference in report["cases"].items():
        assert difference <= TOLERANCE, case
