"""Worker: a small transformers model (random init, nothing downloaded) trained under
Accelerate with its DDP and with gradsched's ``prepare`` for every policy, 2 ranks, with
``accelerator.accumulate`` and ``accelerator.clip_grad_norm_``; a checkpoint written by
``accelerator.save_state`` mid-run under gradsched resumes under DDP. Rank 0 writes the
largest difference per case.

    python -m workers.with_accelerate OUT.json CKPT_DIR
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification

from gradsched.integrations.accelerate import GradschedAccelerator, prepare

from workers.launch import finish_with_report

SMALL = {  # sized for this model (about 100k parameters)
"fifo": {"bucket_cap_bytes": 8192, "first_bucket_bytes": 2048}, "priority": {"partition_bytes": 4096},
         "bytescheduler": {"partition_bytes": 4096, "credit_bytes": 16384},
         "prophet": {"partition_bytes": 4096, "credit_bytes": 16384, "profile_iterations": 2}}
POLICIES = tuple(SMALL)
STEPS = 8  # batches per rank; an optimizer step every 2


def model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (2 * STEPS * 4, 12), generator=g)
    labels = torch.randint(0, 3, (2 * STEPS * 4,), generator=g)
    return DataLoader(TensorDataset(ids, labels), batch_size=4)  # Accelerate shards it over the ranks


def train(policy: str | None, first: int = 0, save: str | None = None, load: str | None = None, hook: bool = False,
          subclass: bool = False):
    handlers = [DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)] if hook else []
    if subclass:  # GradschedAccelerator: Accelerate's own prepare() wraps with gradsched
        accelerator = GradschedAccelerator(cpu=True, gradient_accumulation_steps=2, kwargs_handlers=handlers,
                                           policy=policy, policy_options=SMALL[policy], gradsched={"fallback": False})
    else:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, kwargs_handlers=handlers)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    objects = (net, optimizer, loader(), scheduler)
    if policy is None or subclass:
        net, optimizer, data, scheduler = accelerator.prepare(*objects)
    else:
        net, optimizer, data, scheduler = prepare(accelerator, *objects, policy=policy,
                                                  policy_options=SMALL[policy], fallback=False)
    if load:
        accelerator.load_state(load)
    for index, (ids, labels) in enumerate(data):
        if index < first:
            continue
        with accelerator.accumulate(net):
            loss = net(input_ids=ids, labels=labels).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(net.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if save and index + 1 == STEPS // 2:
            accelerator.save_state(save)
    inner = accelerator.unwrap_model(net)  # gradsched's wrapper unwraps as DDP does
    rounds = None
    if policy is not None:
        rounds = net.stats.rounds  # backward passes that communicated
        net.close()
    params = [p.detach().clone() for p in inner.parameters()]
    accelerator.free_memory()
    return params, rounds


def gap(a, b) -> float:
    return max((x - y).abs().nan_to_num(float("inf")).max().item() for x, y in zip(a, b))


def main() -> None:
    out, ckpt = sys.argv[1], sys.argv[2] + "/state"
    report = {"cases": {}, "rounds": {}}
    reference, _ = train(None)
    report["moved"] = gap(reference, list(model().parameters()))
    for policy in POLICIES:
        ours, report["rounds"][policy] = train(policy, save=ckpt if policy == "prophet" else None)
        report["cases"][policy] = gap(ours, reference)
    report["cases"]["resume-under-ddp"] = gap(train(None, first=STEPS // 2, load=ckpt)[0], reference)
    hooked, _ = train(None, hook=True)  # DistributedDataParallelKwargs(comm_hook=FP16): fp16 on the wire
    report["hook_bites"] = gap(hooked, reference)
    report["cases"]["fp16-hook/prophet"] = gap(train("prophet", hook=True)[0], hooked)
    report["cases"]["accelerator/bytescheduler"] = gap(train("bytescheduler", subclass=True)[0], reference)
    report["cases"]["accelerator/fp16-hook/prophet"] = gap(train("prophet", hook=True, subclass=True)[0], hooked)
    finish_with_report(out, report)


if __name__ == "__main__":
    main()
