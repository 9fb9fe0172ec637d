"""Worker: a rank whose link is slower, named by every rank (tests/bench/test_slow_link.py).

    ip netns exec NS python tests/workers/slow_link.py

Run in the emulated cluster's namespaces (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
GLOO_SOCKET_IFNAME set): three small layers trained a few steps under prophet's own plans;
rank 0 prints, as one JSON line, every rank's ``stats.ranks`` and what rank 0's ``gradsched``
logger said at WARNING.
"""

import dataclasses
import json
import logging

import torch
import torch.distributed as dist
from torch import nn

import gradsched

STEPS = 8


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    said = Said()
    logging.getLogger("gradsched").addHandler(said)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01), "prophet",
                                        profile_rounds=2, replan_every=3, fallback=False)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS):
        optimizer.zero_grad()
        wrapped(torch.randn(4, 64, generator=generator)).square().mean().backward()
        optimizer.step()
    ranks = optimizer.stats.ranks
    optimizer.close()
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, None if ranks is None else dataclasses.asdict(ranks))
    if dist.get_rank() == 0:
        print(json.dumps({"ranks": reports, "said": said.lines}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
