"""DDP communication hooks on gradsched's messages, in one process (no collectives): what a hook
sees of each message (GradBucket's methods), that its Future's value lands in the message, and
that bucket indices stay stable across re-plans for messages whose contents stay."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import gradsched
from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.comm_hook import HookTransport, synchronous, wire_dtype_of
from gradsched.runtime.comm.plans import PlanVersions
from gradsched.runtime.comm.transport import MessageKey
from gradsched.runtime.errors import GradschedError

PARAMS = {"w": torch.nn.Parameter(torch.zeros(4, 3)), "b": torch.nn.Parameter(torch.zeros(5)),
          "h": torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))}


def plan(*messages: tuple) -> Plan:
    return Plan("priority", True, tuple(PlannedMessage(tuple(slices), 4, None, None, 0.0, 1.0) for slices in messages),
                span_s=1.0)


def doubling(seen: list):
    def hook(state, bucket):
        seen.append({"index": bucket.index(), "last": bucket.is_last(), "state": state,
                     "shapes": [tuple(g.shape) for g in bucket.gradients()],
                     "params": [p.shape for p in bucket.parameters()]})
        future = torch.futures.Future()
        future.set_result(bucket.buffer() * 2)  # another tensor: copied into the message
        return future
    return hook


def send(transport, key: MessageKey, sizes: list[int], dtypes=(torch.float32,)) -> list[torch.Tensor]:
    buffers = [torch.ones(n, dtype=d) for n, d in zip(sizes, dtypes)]
    for future in transport.send(key, buffers):
        future.wait()
    return buffers


def test_a_hook_sees_each_message_as_a_bucket_and_its_result_lands_in_it():
    seen: list = []
    versions = PlanVersions(plan([("b", 0, 5), ("w", 0, 6)], [("w", 6, 6)], [("h", 0, 2), ("b", 1, 2)]))
    transport = HookTransport(doubling(seen), "state", versions, PARAMS, rank=0)
    assert send(transport, MessageKey(1, 1, 0), [11])[0].tolist() == [2.0] * 11
    send(transport, MessageKey(1, 1, 1), [6])
    send(transport, MessageKey(1, 1, 2), [2, 2], (torch.float32, torch.float64))  # two dtypes: two buckets
    assert [s["index"] for s in seen] == [0, 1, 2, 3]
    assert [s["last"] for s in seen] == [False, False, False, True]  # the round's last buffer
    assert seen[0]["shapes"] == [(5,), (2, 3)]  # whole gradient: its shape; a slice of whole rows: rows
    assert seen[1]["shapes"] == [(2, 3)] and seen[0]["params"] == [torch.Size([5]), torch.Size([4, 3])]
    assert seen[2]["shapes"] == [(2,)] and seen[3]["params"] == [torch.Size([2])]  # float32 first, then float64
    assert all(s["state"] == "state" for s in seen)


def test_bucket_indices_stay_with_a_messages_contents_across_replans(caplog):
    seen: list = []
    versions = PlanVersions(plan([("b", 0, 5)], [("w", 0, 12)]))
    transport = HookTransport(doubling(seen), None, versions, PARAMS, rank=0)
    send(transport, MessageKey(1, 1, 0), [5])
    send(transport, MessageKey(1, 1, 1), [12])
    versions.adopt(plan([("b", 0, 5)], [("w", 0, 6)], [("w", 6, 6)]), 2)  # w cut in two: new contents
    with caplog.at_level(logging.INFO, logger="gradsched"):
        send(transport, MessageKey(2, 2, 0), [5])
        send(transport, MessageKey(2, 2, 1), [6])
        send(transport, MessageKey(2, 2, 2), [6])
    assert [s["index"] for s in seen] == [0, 1, 0, 2, 3]  # b kept its index; w's halves are new
    assert "starts afresh" in caplog.text


def test_a_hooks_broken_contract_is_named():
    versions = PlanVersions(plan([("b", 0, 5)]))
    with pytest.raises(GradschedError, match="returned NoneType, not a torch.futures.Future"):
        HookTransport(lambda state, bucket: None, None, versions, PARAMS, rank=0).send(MessageKey(1, 1, 0),
                                                                                    [torch.ones(5)])

    def short(state, bucket):
        future = torch.futures.Future()
        future.set_result(torch.ones(3))
        return future

    with pytest.raises(Exception, match="returned 3 elements for a bucket of 5"):  # a hook of its own: waited for
        HookTransport(short, None, versions, PARAMS, rank=0).send(MessageKey(1, 1, 0), [torch.ones(5)])


def test_which_hooks_pipeline_and_what_they_send():
    assert synchronous(default_hooks.allreduce_hook) and synchronous(default_hooks.fp16_compress_hook)
    assert synchronous(default_hooks.bf16_compress_wrapper(default_hooks.allreduce_hook))
    assert not synchronous(powerSGD_hook.powerSGD_hook)  # it communicates in its futures' callbacks
    assert not synchronous(default_hooks.fp16_compress_wrapper(powerSGD_hook.powerSGD_hook))
    assert wire_dtype_of(default_hooks.bf16_compress_hook) is torch.bfloat16
    assert wire_dtype_of(default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)) is torch.float16
    assert wire_dtype_of(default_hooks.allreduce_hook) is None and wire_dtype_of(powerSGD_hook.powerSGD_hook) is None

    def mine(state, bucket):
        return default_hooks.allreduce_hook(state, bucket)

    assert not synchronous(mine)  # unknown: one message at a time
    assert gradsched.pipelined(mine) is mine and synchronous(mine)  # said to issue inside the call


def test_a_hook_on_the_default_group_is_given_gradscheds_own(world_of_one):
    """The states PyTorch's hooks take (a group, None) and PowerSGD's: where they name the default
    group or the wrapper's, the hook communicates on gradsched's data group instead."""
    import torch.distributed as dist

    from gradsched.runtime.comm.comm_hook import hook_state

    ours, users, other = dist.new_group(), dist.new_group(), dist.new_group()
    assert hook_state(None, ours, None) is ours and hook_state(dist.group.WORLD, ours, None) is ours
    assert hook_state(users, ours, users) is ours and hook_state(other, ours, users) is other
    powersgd = powerSGD_hook.PowerSGDState(process_group=None)
    assert hook_state(powersgd, ours, None) is powersgd and powersgd.process_group is ours
    kept = powerSGD_hook.PowerSGDState(process_group=other)
    assert hook_state(kept, ours, None).process_group is other
    assert hook_state({"calls": 0}, ours, None) == {"calls": 0}  # a state of the user's own: as it is
