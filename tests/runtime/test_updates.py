"""Deferred updates keep what a step() was given: AMP's scale and overflow flag for fused
optimizers (GradScaler sets them on the optimizer for the duration of its step() only)."""

from __future__ import annotations

import torch
from helpers import LiveTemporaries

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
        updates = DeferredUpdates(optimizer, [param], ["w"], trace=None)
        optimizer.grad_scale, optimizer.found_inf = torch.tensor(4.0), torch.tensor(found_inf)
        snapshot = updates.snapshot()
        del optimizer.grad_scale, optimizer.found_inf
        updates.apply_now([0], snapshot)
        assert torch.equal(param.detach(), expected.detach()), found_inf
        assert torch.equal(param.detach(), start) == (found_inf == 1.0)  # an overflow skips the step
        assert not hasattr(optimizer, "grad_scale") and not hasattr(optimizer, "found_inf")  # as it was left


def test_a_partial_update_holds_no_more_temporaries_than_the_full_step():
    """Updating the weights of several layers without their biases (a deferred update's usual
    subset) holds at most the temporaries of the optimizer's full step: torch's per-tensor loop
    keeps one tensor's temporaries while it computes the next's, so two weights in one step()
    held three weights' worth of them, where the full step (a bias between) holds two."""
    torch.manual_seed(0)
    params = list(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).parameters())
    optimizer = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()  # the state exists from here on
    with LiveTemporaries() as full:
        optimizer.step()
    updates = DeferredUpdates(optimizer, params, [str(i) for i in range(len(params))], trace=None)
    with LiveTemporaries() as same:
        updates.step_only({id(p) for p in params}, updates.snapshot())
    with LiveTemporaries() as weights:
        updates.step_only({id(p) for p in params[0::2]}, updates.snapshot())
    assert same.peak == full.peak
    assert weights.peak <= full.peak < 3 * params[0].nbytes, (weights.peak, full.peak)
    # cut only where it matters: one step() for all, or for the biases (gaps of weights between
    # them, their temporaries small), one per weight
    calls = []
    optimizer.register_step_pre_hook(lambda *args: calls.append(1))
    for subset, steps in ((params, 1), (params[1::2], 1), (params[0::2], 4)):
        calls.clear()
        updates.step_only({id(p) for p in subset}, updates.snapshot())
        assert len(calls) == steps
