"""Worker: what a rank does with messages that are not gradsched's (2 gloo ranks).

1. Over the stream parameter servers receive plans on, rank 0 sends: a pickle that would
   create a file if it were unpickled, a message of a future wire-format version, a plan
   whose fields have the wrong types, a size no message has, then a good plan. Rank 1
   receives each and records the error (or the plan).
2. Both ranks wrap a model, rank 1 speaking another wire-format version: every rank must
   refuse at wrap time with an error naming both versions, parameters untouched.

Usage: foreign.py OUT.json MARKER_PATH
"""

import json
import os
import pickle
import sys

import msgspec
import torch
import torch.distributed as dist

from workers.launch import finish_with_report

import gradsched
from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm import wire_format
from gradsched.runtime.comm.wire_format import PlanUpdate, WireFormatError

out, marker = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
group = dist.new_group(backend="gloo")


class Exploit:
    """Unpickling this runs ``open(marker, "w")``."""

    def __reduce__(self):
        return (open, (marker, "w"))


good = Plan("fifo", False, (PlannedMessage((("w", 0, 4),), 16, "w", None, 0.0, 1.0),), 1.0)


def envelope(body, version=wire_format.VERSION, kind="plan") -> bytes:
    return msgspec.msgpack.encode(wire_format._Envelope(wire_format.FORMAT, version, kind,
                                                        msgspec.Raw(msgspec.msgpack.encode(body))))


fields = msgspec.to_builtins(PlanUpdate(1, good))
fields["plan"]["messages"][0]["nbytes"] = "16"  # a field of the wrong type
whole = wire_format.encode("plan", PlanUpdate(1, good))
streams = [pickle.dumps(Exploit()), envelope(PlanUpdate(1, good), version=wire_format.VERSION + 1), envelope(fields),
           whole[: len(whole) // 2], envelope(PlanUpdate(1, good), kind="checks")]
report = {"errors": []}
if rank == 0:
    works = []
    for payload in streams:
        size = torch.tensor([len(payload)], dtype=torch.int64)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        works += [dist.isend(size, 1, group=group), dist.isend(data, 1, group=group), (size, data)]
    works.append(dist.isend(torch.tensor([-5], dtype=torch.int64), 1, group=group))
    good_works, keep = wire_format.send("plan", PlanUpdate(7, good), 1, group)
    for work in works + good_works:
        if not isinstance(work, tuple):
            work.wait()
else:
    for _ in range(len(streams) + 1):
        size = torch.zeros(1, dtype=torch.int64)
        work = dist.irecv(size, 0, group=group)
        try:
            wire_format.receive("plan", 0, group, size, work)
            report["errors"].append(None)
        except WireFormatError as exc:
            report["errors"].append(str(exc))
    size = torch.zeros(1, dtype=torch.int64)
    update = wire_format.receive("plan", 0, group, size, dist.irecv(size, 0, group=group))
    report["good"] = update == PlanUpdate(7, good)
report["exploited"] = os.path.exists(marker)

# 2: ranks of different wire-format versions
if rank == 1:
    wire_format.VERSION += 1
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
before = [p.detach().clone() for p in model.parameters()]
try:
    gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), policy="fifo")
    report["versions"] = None
except WireFormatError as exc:
    report["versions"] = str(exc)
report["untouched"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
dist.barrier()
with open(f"{out}.{rank}", "w") as f:
    json.dump(report, f)
finish_with_report(out, report)
