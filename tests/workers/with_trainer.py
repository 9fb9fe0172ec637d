"""Worker: the Hugging Face Trainer with PyTorch's DDP and GradschedTrainer (every policy), 2
ranks, a tiny BERT (random init, nothing downloaded): gradient accumulation, max_grad_norm, an
evaluation every 2 steps, a checkpoint saved mid-run. Rank 0 writes the largest weight
difference per case, the evaluation losses, and whether each checkpoint loads into a plain model
that equals the run's weights at that step.

    python -m workers.with_trainer OUT.json OUT_DIR
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import BertForSequenceClassification, Trainer, TrainingArguments

from gradsched.integrations.transformers import GradschedTrainer

from workers.launch import finish_with_report
from workers.with_accelerate import SMALL, model  #(the tiny BERT, and the policies' options sized for it)

POLICIES = tuple(SMALL)


class Pairs(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def train(policy: str | None, out_dir: str) -> dict:
    args = TrainingArguments(output_dir=out_dir, use_cpu=True, ddp_backend="gloo", per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, gradient_accumulation_steps=2, max_grad_norm=0.5,
                             learning_rate=5e-3, max_steps=6, eval_strategy="steps", eval_steps=2,
                             save_strategy="steps", save_steps=3, save_total_limit=None, logging_steps=1,
                             report_to=[], disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0)
    net = model()
    kwargs = dict(model=net, args=args, train_dataset=Pairs(96, 1), eval_dataset=Pairs(32, 2))
    if policy is None:
        trainer = Trainer(**kwargs)
    else:
        trainer = GradschedTrainer(**kwargs, policy=policy, policy_options=SMALL[policy],
                                   gradsched={"fallback": False})
    trainer.train()
    evals = [round(e["eval_loss"], 7) for e in trainer.state.log_history if "eval_loss" in e]
    out = {"weights": {k: v.detach().clone() for k, v in net.state_dict().items()}, "evals": evals,
           "wrapped": type(trainer.model_wrapped).__module__, "is_ddp": isinstance(
               trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)}
    if policy is not None:
        out["rounds"] = trainer.gradsched_stats.rounds
    checkpoint = os.path.join(out_dir, "checkpoint-3")
    out["checkpoint"] = sorted(os.listdir(checkpoint)) if os.path.isdir(checkpoint) else []
    if os.path.isdir(checkpoint):
        reloaded = BertForSequenceClassification.from_pretrained(checkpoint)
        out["checkpoint_weights"] = {k: v.detach().clone() for k, v in reloaded.state_dict().items()}
    return out


def gap(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().nan_to_num(float("inf")).max().item() for k in a)


def main() -> None:
    out, root = sys.argv[1], sys.argv[2]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    report = {"cases": {}, "evals": {}, "rounds": {}, "checkpoints": {}}
    reference = train(None, f"{root}/ddp")
    report["moved"] = gap(reference["weights"], model().state_dict())
    report["ddp_evals"] = reference["evals"]
    report["ddp_checkpoint"] = reference["checkpoint"]
    for policy in POLICIES:
        ours = train(policy, f"{root}/{policy}")
        report["cases"][policy] = gap(ours["weights"], reference["weights"])
        report["evals"][policy] = ours["evals"]
        report["rounds"][policy] = ours["rounds"]
        report["checkpoints"][policy] = {"files": ours["checkpoint"], "wrapped": ours["wrapped"],
                                         "is_ddp": ours["is_ddp"],
                                         "diff": gap(ours["checkpoint_weights"], reference["checkpoint_weights"])}
    finish_with_report(out, report)


if __name__ == "__main__":
    main()
