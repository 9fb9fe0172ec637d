"""Train a LightningModule with gradsched in place of DDP (pip install 'gradsched[lightning]').

    torchrun --nproc_per_node 2 examples/train_lightning.py [--policy prophet] [--steps 50]
    python examples/train_lightning.py --devices 2     # Lightning starts the second process itself

The strategy is the only gradsched line: ``Trainer(strategy=GradschedStrategy(policy=...))``.
Gradient clipping, accumulation, bf16 and checkpoints are Lightning's own options.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from gradsched.integrations.lightning import GradschedStrategy


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))

    def training_step(self, batch, index):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.trainer.is_global_zero and self.global_step % 10 == 0 and index % 2 == 1:
            print(f"step {self.global_step} loss {loss.item():.4f}", flush=True)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="bytescheduler", choices=["fifo", "priority", "bytescheduler", "prophet"])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    data = DataLoader(TensorDataset(x, x[:, :1] * 2 + 0.1 * torch.randn(4096, 1, generator=g)), batch_size=32)
    strategy = GradschedStrategy(policy=args.policy)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=args.devices, max_steps=args.steps,
                        gradient_clip_val=1.0, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    module = Regressor()
    trainer.fit(module, data)
    checksum = torch.tensor([sum(p.double().sum().item() for p in module.parameters())])
    everyone = [torch.zeros(1, dtype=torch.float64) for _ in range(trainer.world_size)]
    torch.distributed.all_gather(everyone, checksum.double())
    if trainer.is_global_zero:
        print(f"plan in use: {strategy.stats.plan_policy}; measured trial: {strategy.stats.trial}")
        print(f"identical on all workers: {all(torch.equal(c, everyone[0]) for c in everyone)}")


if __name__ == "__main__":
    main()
