"""Worker: one LightningModule trained with Lightning's DDPStrategy and with
GradschedStrategy for every policy, 2 ranks; rank 0 writes the largest difference per case.

    python -m workers.with_lightning OUT.json CKPT_DIR
"""

from __future__ import annotations

import logging
import sys
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.strategies import DDPStrategy

from gradsched.integrations.lightning import GradschedStrategy

from workers.launch import finish_with_report
from workers.train_compare import SMALL  #(the policies' options sized for small models)

POLICIES = tuple(SMALL)


class Classifier(L.LightningModule):
    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))
        self.automatic_optimization = not manual

    def training_step(self, batch, index):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            optimizer.step()
            self.lr_schedulers().step()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 20, generator=g), torch.randint(0, 5, (64,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8)  # Lightning adds the DistributedSampler


def fit(strategy, epochs: int, manual: bool = False, precision: str = "32-true", ckpt_path=None,
        save: str | None = None, clip: float = 0.5) -> list[torch.Tensor]:
    module = Classifier(manual)
    clipping = {} if manual else {"gradient_clip_val": clip, "accumulate_grad_batches": 2}
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=epochs, precision=precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **clipping)
    trainer.fit(module, data(), ckpt_path=ckpt_path)
    if save:
        trainer.save_checkpoint(save)
    return [p.detach().clone() for p in module.parameters()]


class HookedDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy, registering its communication hook on CPU too (it does on CUDA only)."""

    def _register_ddp_hooks(self) -> None:
        from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook

        _register_ddp_comm_hook(self.model, self._ddp_comm_state, self._ddp_comm_hook, self._ddp_comm_wrapper)


def gap(a, b) -> float:
    return max((x - y).abs().nan_to_num(float("inf")).max().item() for x, y in zip(a, b))


def main() -> None:
    out, ckpt_dir = sys.argv[1], sys.argv[2]
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    report = {"cases": {}, "moved": {}, "rounds": {}}
    initial = [p.detach().clone() for p in Classifier().parameters()]
    report["clipping_bites"] = gap(fit(DDPStrategy(), 2), fit(DDPStrategy(), 2, clip=0.0))
    for name, kwargs in {"auto": {}, "bf16": {"precision": "bf16-mixed"}, "manual": {"manual": True}}.items():
        reference = fit(DDPStrategy(), 2, **kwargs)
        report["moved"][name] = gap(reference, initial)
        for policy in POLICIES:
            strategy = GradschedStrategy(policy=policy, policy_options=SMALL[policy], fallback=False)
            ours = fit(strategy, 2, **kwargs)
            report["cases"][f"{name}/{policy}"] = gap(ours, reference)
            report["rounds"][f"{name}/{policy}"] = strategy.stats.rounds  # backward passes that communicated
    # a communication hook (ddp_comm_hook=), fp16 on the wire: against DDP with the same hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    reference = fit(HookedDDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook), 2)
    report["hook_bites"] = gap(reference, fit(DDPStrategy(), 2))
    for policy in ("fifo", "prophet"):
        strategy = GradschedStrategy(policy=policy, policy_options=SMALL[policy], fallback=False,
                                     ddp_comm_hook=default_hooks.fp16_compress_hook)
        report["cases"][f"fp16-hook/{policy}"] = gap(fit(strategy, 2), reference)
    # past the hand-off to DDP's reducer (the trial keeps the buckets for certain), Lightning's
    # automatic optimization stepping with a closure on either side of it: 10 epochs, 20 rounds
    strategy = GradschedStrategy(policy="prophet", policy_options=SMALL["prophet"], fallback_gain=0.99,
                                 profile_rounds=2, trial_rounds=3, trial_pairs=1)
    report["cases"]["handoff/prophet"] = gap(fit(strategy, 10), fit(DDPStrategy(), 10))
    report["handed_off"] = strategy.stats.handed_off_round
    # resume: 2 epochs, a checkpoint, 2 more, against 4 uninterrupted (DDP), both ways
    reference = fit(DDPStrategy(), 4)
    half = f"{ckpt_dir}/half.ckpt"
    fit(GradschedStrategy(policy="prophet", policy_options=SMALL["prophet"]), 2, save=half)
    resumed = fit(GradschedStrategy(policy="prophet", policy_options=SMALL["prophet"]), 4, ckpt_path=half)
    report["cases"]["resume/prophet"] = gap(resumed, reference)
    resumed = fit(DDPStrategy(), 4, ckpt_path=half)
    report["cases"]["resume/gradsched-to-ddp"] = gap(resumed, reference)
    finish_with_report(out, report)


if __name__ == "__main__":
    main()
