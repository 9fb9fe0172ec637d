"""The wire format of plans, proposals and wrap-time checks: exact round trips, and a clear
error for anything else (no process group needed, except for the one-rank collectives)."""

from __future__ import annotations

import math
import pickle

import msgspec
import pytest

from gradsched.control.arms import TrialReport, TuningReport
from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm import wire_format
from gradsched.runtime.diagnostics.stats import Prediction
from gradsched.runtime.comm.wire_format import PlanUpdate, Proposal, RankChecks, WireFormatError, decode, encode

PLAN = Plan("bytescheduler", True, (
    PlannedMessage((("b.w", 0, 10), ("b.b", 0, 2)), 48, "b.w", None, 0.0, 1.5),
    PlannedMessage((("a.w", 0, 7),), 28, None, 0, 1.5, 2.0, after_sent=True),
), span_s=2.0, options=(("amortise", 9.0), ("credit_bytes", 12 << 20), ("fuse_bytes", 0),
                      ("partition_bytes", 4 << 20)))
PROPOSAL = Proposal(PLAN, Prediction(0.1, 1e-4, 2e-5, 0.2, 0.21, 0.25, separable=False, use_fifo=True),
                    TrialReport(0.2, 0.19, True),
                    TuningReport({"partition_bytes": 1 << 20, "credit_bytes": 4 << 20}, 0.2, math.inf, None,
                                 [{"trial": 0, "iteration_s": 0.2, "options": {"partition_bytes": 1 << 20}}]))
CHECKS = RankChecks([("a.w", (7,), "torch.float32"), ("b.w", (2, 5), "torch.bfloat16")], '{"policy": {}}',
                    [(1.5, 2.25), (-0.0, 0.0)])


@pytest.mark.parametrize("kind, body", [("plan", PlanUpdate(4, PLAN)), ("proposal", PROPOSAL),
                                        ("proposal", Proposal(None)), ("checks", CHECKS)])
def test_every_kind_round_trips_exactly(kind, body):
    assert decode(encode(kind, body), kind, "rank 0") == body


def test_the_body_must_be_of_its_kind():
    with pytest.raises(TypeError, match="a 'plan' message carries a PlanUpdate, not a Plan"):
        encode("plan", PLAN)


def _envelope(body, version=wire_format.VERSION, fmt=wire_format.FORMAT, kind="plan") -> bytes:
    return msgspec.msgpack.encode(wire_format._Envelope(fmt, version, kind, msgspec.Raw(msgspec.msgpack.encode(body))))


def _fields(**changes):
    fields = msgspec.to_builtins(PlanUpdate(4, PLAN))
    fields["plan"]["messages"][1].update(changes)
    return fields


@pytest.mark.parametrize("data, match", [
    (pickle.dumps(PlanUpdate(4, PLAN)), "a message from rank 3 is not a gradsched message"),
    (b"", "a message from rank 3 is not a gradsched message"),
    (encode("plan", PlanUpdate(4, PLAN))[:-3], "a message from rank 3 is not a gradsched message"),
    (msgspec.msgpack.encode({"policy": "fifo"}), "a message from rank 3 is not a gradsched message"),
    (_envelope(PlanUpdate(4, PLAN), fmt="torch"), r"not a gradsched message \(format 'torch'\)"),
    (_envelope(PlanUpdate(4, PLAN), version=0),
     f"rank 3 speaks gradsched wire format version 0, this rank version {wire_format.VERSION}"),
    (_envelope(CHECKS, kind="checks"), "expected a 'plan' message from rank 3, got a 'checks' message"),
    (_envelope(_fields(nbytes="28")), r"Expected `int`, got `str` - at `\$.plan.messages\[1\].nbytes`"),
    (_envelope(_fields(slices=[["a.w", 0]])), r"Expected `array` of length 3, got 2 - at `\$.plan.messages\[1\].slices\[0\]`"),
    (_envelope({"version": 4}), r"Object missing required field `plan`"),
])
def test_anything_else_is_refused_naming_the_sender_and_the_fault(data, match):
    with pytest.raises(WireFormatError, match=match):
        decode(data, "plan", "rank 3")


def test_a_pickle_is_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(WireFormatError):
        decode(pickle.dumps(Exploit()), "proposal", "rank 0")
    assert not marker.exists()


def test_collectives_carry_messages(world_of_one):
    assert wire_format.broadcast("proposal", PROPOSAL, 0, None) == PROPOSAL
    assert wire_format.all_gather("checks", CHECKS, None) == [CHECKS]


def test_messages_between_ranks_need_torch_alone(tmp_path):
    """``pip install gradsched`` brings torch, which runs without numpy: what arrives from another
    rank is read without it (two ranks, numpy made unimportable in each)."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(f"""
        import sys
        sys.modules["numpy"] = None  # import numpy fails from here on
        import torch, torch.distributed as dist
        from gradsched.runtime.comm import wire_format
        from gradsched.core.plan import Plan, PlannedMessage
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=rank, world_size=2)
        plan = Plan("fifo", False, (PlannedMessage((("w", 0, 4),), 16, None, None, 0.0, 1.0),), span_s=1.0)
        assert wire_format.broadcast("plan", wire_format.PlanUpdate(rank + 1, plan), 0, None).version == 1
        assert [u.version for u in wire_format.all_gather("plan", wire_format.PlanUpdate(rank, plan), None)] == [0, 1]
        dist.destroy_process_group()
        print("ok")
    """)
    ranks = [subprocess.Popen([sys.executable, "-c", program, str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0 and out.strip() == "ok", err[-2000:]
