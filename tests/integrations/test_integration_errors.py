"""The integrations' bad input, in one process: one clear error each."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed: pip install 'gradsched[lightning]'")
pytest.importorskip("accelerate", reason="the accelerate extra is not installed: pip install 'gradsched[accelerate]'")


def test_gradsched_strategy_refuses_post_local_sgd():
    from gradsched.integrations.lightning import GradschedStrategy

    with pytest.raises(ValueError, match="model_averaging_period= \\(post-local SGD\\)"):
        GradschedStrategy(model_averaging_period=4)
    assert GradschedStrategy(policy="prophet", find_unused_parameters=True)._ddp_kwargs == {
        "find_unused_parameters": True}


def test_the_strategy_is_registered_by_name():
    import lightning as L

    from gradsched.integrations.lightning import GradschedStrategy

    trainer = L.Trainer(strategy="gradsched", accelerator="cpu", devices=1, logger=False)
    assert type(trainer.strategy) is GradschedStrategy


def test_prepare_needs_one_model_and_several_processes():
    import torch
    from accelerate import Accelerator

    from gradsched.integrations.accelerate import prepare

    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="pass exactly one model, got 0"):
        prepare(accelerator, optimizer)
    with pytest.raises(ValueError, match="gradsched replaces DDP only"):
        prepare(accelerator, torch.nn.Linear(2, 2), optimizer)
