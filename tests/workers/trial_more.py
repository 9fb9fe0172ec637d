"""Worker: the measured trial where its pairs cannot tell the policy from the buckets, through
real processes; rank 0 writes each rank's report.

    python -m workers.trial_more OUT.json SLOWER_MS

Every iteration sleeps after its step by where its backward pass lies in its arm: nothing,
D and 2D over an arm's three measured rounds (so each arm's median is D more and its spread
as large: no pair's difference is beyond its noise), and SLOWER_MS more on the policy's
plans (negative: that much more on the buckets'). With SLOWER_MS -15 the policy is a few per
cent faster, well inside the noise (its own launching costs a few ms more on this small model):
the trial measures its two extra pairs, every rank extending its schedule at the same step,
and then the prediction decides. With SLOWER_MS 60 the policy is slower by far more than the
margin in every pair: the buckets are kept after the first two pairs, whatever the noise and
the prediction say. The parameters end as DDP's in both.
"""

import logging
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsched
from workers.launch import finish_with_report
from workers.train_compare import against, batches, seeded_reference

PROFILE, ROUNDS = 2, 5  # the first arm starts after round PROFILE + 1
STEPS = PROFILE + 1 + 8 * ROUNDS + 3  # profiling, two pairs and two extra pairs of arms, three rounds after
D = 0.15  # seconds: the spread of an arm's measured rounds (the policy's own few ms more are 1% of it)


def pause(round_index: int, on_policy: bool, slower_s: float) -> None:
    offset = (round_index - PROFILE - 2) % ROUNDS  # of the round in its arm (0 and ROUNDS - 1 are not measured)
    if round_index > PROFILE + 1 and 1 <= offset <= ROUNDS - 2:
        time.sleep(D * (offset - 1) + (max(slower_s, 0.0) if on_policy else max(-slower_s, 0.0)))


def train(model, opt, data, wrapped=None, slower_s=0.0) -> None:
    """The last three steps, after the trial, step with a closure (Lightning's automatic
    optimization): forward and backward inside ``step()``."""
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(data, start=1):
        on_policy = wrapped is not None and wrapped.stats.plan_policy != "fifo"  # the plan of this round
        opt.zero_grad()
        if step > len(data) - 3:
            opt.step(lambda: loss_fn(model(x), y).backward())
        else:
            loss_fn(model(x), y).backward()
            opt.step()
        if wrapped is not None:
            pause(step, on_policy, slower_s)


logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
data = batches(rank, STEPS)
model, initial = seeded_reference()
model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.05), "prophet",
                            profile_rounds=PROFILE, trial_rounds=ROUNDS,
                            trial_pairs=2, trial_extra_pairs=2, replan_every=0, handoff=False)
train(model, opt, data, opt, float(sys.argv[2]) / 1e3)
opt.synchronize()
stats = opt.stats
report = {"trial": stats.as_dict()["trial"], "settled_round": stats.settled_round, "rounds": stats.rounds,
          "plan_policy": stats.plan_policy}
opt.close()
reference, _ = seeded_reference()
ddp = DDP(reference)
train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), data)
report.update(against(model, reference, initial))
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, report)
finish_with_report(sys.argv[1], everyone)
