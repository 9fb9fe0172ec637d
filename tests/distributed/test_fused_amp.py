"""A fused optimizer (AdamW, fused=True) under AMP's GradScaler through both of gradsched's ways
in, every policy, on 2 gloo ranks (fused_amp.py), against PyTorch's DDP: the step that
overflows is skipped and the others unscale as DDP's do. Tolerance: 1e-6 absolute."""

from __future__ import annotations

import torch

from workers.launch import run_ranks


def test_fused_adamw_with_grad_scaler_equals_ddp(tmp_path):
    out = tmp_path / "fused"
    results = run_ranks("fused_amp", 2, str(out), timeout=240)
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr[-4000:]
        runs = torch.load(tmp_path / f"fused.rank{rank}.pt")
        reference = runs.pop("torch")
        assert len(runs) == 8
        for run, params in runs.items():
            assert params.keys() == reference.keys()
            for name, value in reference.items():
                torch.testing.assert_close(params[name], value, rtol=0, atol=1e-6, msg=f"rank {rank} {run}: {name}")
