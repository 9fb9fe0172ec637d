"""Train a small transformers model under Hugging Face Accelerate with gradsched in place of
DDP (pip install 'gradsched[accelerate]'; the model is built from a config, nothing is
downloaded).

    torchrun --nproc_per_node 2 examples/train_accelerate.py [--policy prophet] [--steps 50]
    accelerate launch --cpu --num_processes 2 examples/train_accelerate.py

The one gradsched line is ``prepare(accelerator, ...)`` in place of ``accelerator.prepare(...)``;
``accelerator.accumulate``, ``accelerator.clip_grad_norm_`` and ``save_state`` work as with DDP.
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification

from gradsched.integrations.accelerate import prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="bytescheduler", choices=["fifo", "priority", "bytescheduler", "prophet"])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
        max_position_embeddings=64, num_labels=4))
    g = torch.Generator().manual_seed(0)
    samples = args.steps * 2 * 8 * accelerator.num_processes
    ids = torch.randint(0, 1000, (samples, 32), generator=g)
    labels = ids[:, 0] % 4  # learnable: the class is in the first token
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=args.steps)
    model, optimizer, data, scheduler = prepare(accelerator, model, optimizer,
                                                DataLoader(TensorDataset(ids, labels), batch_size=8), scheduler,
                                                policy=args.policy)
    step = 0
    for batch_ids, batch_labels in data:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch_ids, labels=batch_labels).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            if step % 10 == 0:
                accelerator.print(f"step {step} loss {loss.item():.4f}")
    checksum = torch.tensor([sum(p.double().sum().item() for p in model.module.parameters())])
    everyone = accelerator.gather(checksum)
    accelerator.print(f"plan in use: {model.stats.plan_policy}")
    accelerator.print(f"identical on all workers: {bool((everyone == everyone[0]).all())}")
    model.close()


if __name__ == "__main__":
    main()
