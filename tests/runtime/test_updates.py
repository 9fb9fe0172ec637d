"""Deferred updates keep what a step() was given: AMP's scale and overflow flag for fused
optimizers (GradScaler sets them on the optimizer for the duration of its step() only)."""

from __future__ import annotations

import torch

from gradsched.runtime.training.updates import DeferredUpdates


def _fused(param: torch.Tensor) -> torch.optim.Optimizer:
    return torch.optim.AdamW([param], lr=0.1, fused=True)


def test_an_update_applied_later_still_unscales_and_skips_overflows():
    torch.manual_seed(0)
    start, grad = torch.randn(8), torch.randn(8)
    for found_inf in (0.0, 1.0):
        # the reference: the fused step inside GradScaler's step(), attributes set
        expected = torch.nn.Parameter(start.clone())
        expected.grad = grad * 4.0
        reference = _fused(expected)
        reference.grad_scale, reference.found_inf = torch.tensor(4.0), torch.tensor(found_inf)
        reference.step()
        # gradsched: the step is recorded while the attributes are set, and applied after
        # GradScaler removed them
        param = torch.nn.Parameter(start.clone())
        param.grad = grad * 4.0
        optimizer = _fused(param)
        updates = DeferredUpdates(optimizer, [param], ["w"], exchange=None, handover=None, trace=None)
        optimizer.grad_scale, optimizer.found_inf = torch.tensor(4.0), torch.tensor(found_inf)
        snapshot = updates.snapshot()
        del optimizer.grad_scale, optimizer.found_inf
        updates.apply_now([0], snapshot)
        assert torch.equal(param.detach(), expected.detach()), found_inf
        assert torch.equal(param.detach(), start) == (found_inf == 1.0)  # an overflow skips the step
        assert not hasattr(optimizer, "grad_scale") and not hasattr(optimizer, "found_inf")  # as it was left
