"""Worker: a rank whose link is slower, named by every rank (tests/bench/test_slow_link.py).

    ip netns exec NS python tests/workers/slow_link.py

Run in the emulated cluster's namespaces (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
GLOO_SOCKET_IFNAME set): three small layers trained a few steps under prophet's own plans;
rank 0 prints, as one JSON line, every rank's ``stats.ranks`` and what rank 0's ``gradsched``
logger said at WARNING.

A link slow in bursts, at chosen control points: with SLOW_LINK_AT (iterations, e.g. "4,7"),
SLOW_LINK_FILE (a path the launcher watches), SLOW_LINK_STEPS and SLOW_LINK_REPLAN (replan_every),
rank 0 asks the launcher, before each of those iterations, to slow the link ("slow" written to
the file) and before the next to make it fast again ("fast"), and waits until it says done
("done"); the other ranks wait for rank 0 in that iteration's collectives, so each control
point's probe, at its iteration's step, meets the link as asked.
"""

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import gradsched

STEPS = int(os.environ.get("SLOW_LINK_STEPS", "8"))
REPLAN = int(os.environ.get("SLOW_LINK_REPLAN", "3"))
SLOW_AT = {int(i) for i in os.environ.get("SLOW_LINK_AT", "").split(",") if i}


def ask(path: Path, state: str) -> None:
    """The launcher sets rank ``SLOW_LINK_RANK``'s link ``state`` (slow or fast); back once it has."""
    path.write_text(state)
    deadline = time.monotonic() + 60
    while path.read_text() != "done":
        if time.monotonic() > deadline:
            raise TimeoutError(f"the launcher did not set the link {state} in 60 s")
        time.sleep(0.01)


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
                                        profile_rounds=2, replan_every=REPLAN, fallback=False)
    generator = torch.Generator().manual_seed(dist.get_rank())
    control = Path(os.environ["SLOW_LINK_FILE"]) if SLOW_AT and dist.get_rank() == 0 else None
    for i in range(STEPS):
        if control is not None and (i in SLOW_AT) != (i - 1 in SLOW_AT):
            ask(control, "slow" if i in SLOW_AT else "fast")
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
