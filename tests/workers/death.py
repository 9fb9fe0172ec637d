"""Worker (or server): train until communication fails; rank 0 reports how it failed and how fast.

The rank named by VICTIM (default 1) kills itself (SIGKILL, no clean-up): a worker after 25
steps, a parameter server (SERVERS > 0: the last ranks) when it starts its 25th round. With
HANG=S a worker victim instead stops responding for S seconds (it sleeps, its connections
open), so the others can only notice through the timeout (TIMEOUT, default 30 s); with
STOP=S it is stopped (SIGSTOP) instead, and SIGKILLed S seconds later by a process it started.
Prints one JSON line per surviving rank."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import gradsched

dist.init_process_group("gloo")
rank = dist.get_rank()
victim = int(os.environ.get("VICTIM", "1"))
servers = int(os.environ.get("SERVERS", "0"))
hang_s = float(os.environ.get("HANG", "0"))
stop_s = float(os.environ.get("STOP", "0"))
ps = {"architecture": "ps", "servers": servers} if servers else {}
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
if rank == victim and rank >= dist.get_world_size() - servers:
    from gradsched.runtime.comm import server as ps_server

    serve_round = ps_server.Server._post_receives

    def receive_then_die(self, version):
        if self.rounds == 24:
            os.kill(os.getpid(), signal.SIGKILL)
        return serve_round(self, version)

    ps_server.Server._post_receives = receive_then_die
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
last_ok = time.monotonic()
steps = 0
try:
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01), "bytescheduler",
                                policy_options={"partition_bytes": 16384, "credit_bytes": 65536},
                                timeout=float(os.environ.get("TIMEOUT", "30")),
                                handoff=False, **ps)  # gradsched's own failure handling (DDP's, once handed off)
    if opt is None:  # a parameter server, done serving (the workers train until one fails: not reached)
        sys.exit(0)
    while True:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        last_ok = time.monotonic()
        if steps == 25 and rank == victim:
            if hang_s:
                time.sleep(hang_s)
                os._exit(4)  # the others gave up on this rank long ago
            if stop_s:
                subprocess.Popen(["sh", "-c", f"sleep {stop_s}; kill -KILL {os.getpid()}"], start_new_session=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGKILL)
except Exception as exc:  # noqa: BLE001 - the point of the test
    print(json.dumps({"steps": steps, "type": type(exc).__name__, "message": str(exc)[:300],
                      "seconds_after_last_step": time.monotonic() - last_ok}), flush=True)
    raise SystemExit(3)
