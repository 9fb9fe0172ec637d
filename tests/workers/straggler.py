"""Worker: one slow rank, named by every rank, and the plans made on its ready times; rank 0
writes each rank's report.

    python -m workers.straggler OUT.json SLOW_RANK TRACE [bursts|own]

Six 256x256 layers whose backward passes take 1 ms each (a sleep, as a device computes),
4 ms on rank SLOW_RANK (a straggler 4x slower); with ``bursts``, 5 ms each and 40 ms on that
rank in every fourth step only, so that its median stays fast; with ``own``, rank 0 plans on its
own ready times (``plan_on_slow_rank=False``), the slow rank's layers 8 ms. prophet's own plans, re-planned
every 4 backward passes. Every rank reports what ``stats`` says of the ranks, the predicted
span of the plan in use (made on the slow rank's ready times: about its backward pass, not the
fast ranks'), what the ``gradsched`` logger said, and whether it trains as DDP does.
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

STEPS = 14


def fresh(delay_s):
    """The model, each layer's backward pass ``delay_s()`` long."""
    torch.manual_seed(0)
    layers = [nn.Linear(256, 256) for _ in range(6)]
    for layer in layers:
        layer.register_full_backward_hook(lambda *args: time.sleep(delay_s()))
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())])
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model, opt, rank, steps=None):
    g = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        if steps is not None:
            steps[0] = step
        x = torch.randn(4, 256, generator=g)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()


class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


said = Said()
logging.getLogger("gradsched").addHandler(said)
logging.getLogger("gradsched").setLevel(logging.INFO)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, slow = dist.get_rank(), int(sys.argv[2])
bursts = sys.argv[4:] == ["bursts"]
own = sys.argv[4:] == ["own"]  # rank 0 plans on its own ready times (plan_on_slow_rank=False)
step = [0]
fast_s, slow_s = (0.005, 0.04) if bursts else (0.001, 0.008 if own else 0.004)  # bursts: long enough that
# noise stays under 10%; own: the slow rank far enough behind that a plan on the fast ranks' times is told apart
model, opt = fresh(lambda: slow_s if rank == slow and (not bursts or step[0] % 4 == 0) else fast_s)
model, opt = gradsched.wrap(model, opt, "prophet", fallback=False, replan_every=4, trace=sys.argv[3],
                            plan_on_slow_rank=not own)
train(model, opt, rank, step)
opt.synchronize()
stats = opt.stats
run = opt._coordinator.run
span_s = run.measured.plan_for(stats.rounds + 1).span_s
planned_on = run.measured.planned_on  # rank 0: whose ready times its latest plan was made on
opt.close()
reference, ref_opt = fresh(lambda: 0.0)
train(DDP(reference), ref_opt, rank)
report = {"slow_rank": stats.slow_rank, "ranks": stats.as_dict()["ranks"], "span_s": span_s, "said": said.lines,
          "planned_on": planned_on,
          "max_abs_diff": max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, report)
finish_with_report(sys.argv[1], everyone)
