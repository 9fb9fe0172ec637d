"""A script that ends right after its last step, as users' scripts do: no synchronize(), no
close(), no destroy_process_group(). Rank 1 starts its last iteration DELAY seconds late,
so rank 0's last gradients are still on the wire when its script ends.

    python -m workers.ending DELAY [--without-exit-handler]
"""

import atexit
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import gradsched

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])
model, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01), "bytescheduler")
if "--without-exit-handler" in sys.argv:  # what gradsched did not do before: show the abort it prevents
    handler = sys.modules["gradsched.runtime.frontend.wrap"]._close_at_exit
    atexit.unregister(handler)
for step in range(8):
    if rank == 1 and step == 7:
        time.sleep(float(sys.argv[1]))
    model(torch.randn(16, 512)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"rank {rank} ends", flush=True)
