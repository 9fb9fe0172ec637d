"""gradsched.runtime.comm.layout.Layouts: a plan's flat buffers live while a round may follow it."""

from __future__ import annotations

import torch

from gradsched.core.plan import Plan, PlannedMessage
from gradsched.runtime.comm.layout import Layouts
from gradsched.runtime.comm.plans import PlanVersions


def plan(*messages: tuple[tuple[str, int, int], ...]) -> Plan:
    return Plan("fifo", False, tuple(PlannedMessage(m, 0, None, None, 0.0, 0.0) for m in messages), 0.0)


def test_the_layout_of_a_plan_no_round_follows_is_dropped_at_the_next_request():
    params = [torch.zeros(4), torch.zeros(2)]
    index = {"a": 0, "b": 1}
    versions = PlanVersions(plan((("a", 0, 4), ("b", 0, 2))))
    layouts = Layouts(index, params, versions)
    first = layouts.of(versions.for_round(1))
    assert list(first.fused) == [0]  # one message over both gradients: reduced in place
    versions.adopt(plan((("b", 0, 2),), (("a", 0, 4),)), first_round=3)
    second = layouts.of(versions.for_round(3))  # made while round 2 may still follow the first
    assert layouts.of(versions.for_round(2)) is first and layouts.of(versions.for_round(3)) is second
    versions.forget_before(3)  # the launcher is at round 3: nothing follows the first plan
    assert layouts.of(versions.for_round(3)) is second
    assert list(layouts._made) == [2]  # the first plan's buffer (as large as the gradients) let go


def test_every_plan_lays_its_messages_over_the_same_homes_one_buffer_for_the_run():
    params = [torch.zeros(4), torch.zeros(2), torch.zeros(3)]
    index = {"a": 0, "b": 1, "c": 2}
    versions = PlanVersions(plan((("c", 0, 3), ("b", 0, 2)), (("a", 0, 4),)))
    layouts = Layouts(index, params, versions)
    first = layouts.of(versions.for_round(1))
    versions.adopt(plan((("a", 0, 4),), (("b", 0, 2), ("c", 0, 3)), (("c", 0, 1),)), first_round=2)
    second = layouts.of(versions.for_round(2))
    assert all(first.homes[i] is second.homes[i] for i in range(3))  # the same memory under both plans
    assert sorted(first.fused) == [0, 1]
    # b then c is not their order in the homes (c, b, a: the first plan's), but together they are one
    # range of it, reduced in place as it is; a slice of c is a view
    assert sorted(second.fused) == [0, 1, 2]
    assert second.fused[1].data_ptr() == first.homes[2].data_ptr() and second.fused[1].numel() == 5
    assert second.fused[2].data_ptr() == first.homes[2].data_ptr()
    # a message whose gradients leave a gap in the homes (a with c, b between them) is copied
    versions.adopt(plan((("a", 0, 4), ("c", 0, 3)), (("b", 0, 2),)), first_round=3)
    assert sorted(layouts.of(versions.for_round(3)).fused) == [1]
    layouts.clear()
    assert layouts._homes is None


def test_the_homes_are_chunks_of_at_least_the_bucket_size_cut_between_the_first_plans_messages():
    params = [torch.zeros(8), torch.zeros(8), torch.zeros(20), torch.zeros(2), torch.zeros(4)]
    index = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    versions = PlanVersions(plan((("a", 0, 8), ("b", 0, 8)), (("c", 0, 20), ("d", 0, 2)), (("e", 0, 4),)))
    layouts = Layouts(index, params, versions, chunk_bytes=64)  # 16 floats a chunk
    layout = layouts.of(versions.for_round(1))
    storages = [layout.homes[i].untyped_storage().data_ptr() for i in range(5)]
    # a + b fill one chunk; c + d, one message, stay together though c alone fills a chunk; e: another
    assert storages[0] == storages[1] != storages[2] == storages[3] != storages[4]
    assert sorted(layout.fused) == [0, 1, 2]  # every message of the first plan is a range of one chunk


def test_the_homes_follow_the_plan_given_for_them_whatever_plan_comes_first():
    """The data plane lays the homes out by DDP's buckets (the measured trial's other arm and
    the hand-off's target), not by the policy's first plan: every bucket is then a range of
    them, reduced in place; before, on ResNet-50's replay, all four buckets (0.92 of the
    gradients' bytes) travelled as copies through the trial's buckets rounds."""
    params = [torch.zeros(4), torch.zeros(2), torch.zeros(3)]
    index = {"a": 0, "b": 1, "c": 2}
    buckets = plan((("c", 0, 3), ("b", 0, 2)), (("a", 0, 4),))
    versions = PlanVersions(plan((("a", 0, 4), ("c", 0, 3)), (("b", 0, 2),)))  # the policy's, another order
    layouts = Layouts(index, params, versions, homes_plan=buckets)
    first = layouts.of(versions.for_round(1))
    versions.adopt(buckets, first_round=2)
    assert sorted(layouts.of(versions.for_round(2)).fused) == [0, 1]  # every bucket in place
    assert sorted(first.fused) == [1]  # the policy's a + c is not a range of them: copied
    homes = [first.homes[i].data_ptr() for i in range(3)]
    assert homes[2] < homes[1] < homes[0]  # c, b, a: the buckets' order


def test_the_data_plane_lays_the_homes_out_as_ddps_buckets(world_of_one):
    import gradsched

    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    _, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "prophet", bucket_cap_mb=0.02)
    try:
        homes_plan = optimizer._coordinator.backend.exchange._layouts.homes_plan
        assert homes_plan.policy == "fifo"
        names = [n for n, _ in model.named_parameters()]
        assert [name for m in homes_plan.messages for name in m.tensors] == names[::-1]  # the backward pass's order
        assert len(homes_plan.messages) > 1  # cut at the bucket cap (DDP's first bucket is 1 MiB)
    finally:
        optimizer.close()


def test_a_copied_message_is_divided_as_it_is_copied_bit_for_bit_as_a_copy_divided_after():
    """A message whose gradients are not one range of the homes travels in a copy; with the
    transport's divisor the copy is made divided (one pass over the bytes, not two), large
    members one division each, many small ones copied together and divided once: the same
    values either way as the copy divided in place, which is what DDP's buckets travel as."""
    from gradsched.runtime.comm.layout import DIVIDED_COPY_BYTES

    big = DIVIDED_COPY_BYTES // 4 + 3  # elements of float32: each member above the size divided as copied
    params = [torch.zeros(big), torch.zeros(7), torch.zeros(big), torch.zeros(5)]
    index = {"a": 0, "b": 1, "c": 2, "d": 3}
    homes_plan = plan((("a", 0, big), ("b", 0, 7)), (("c", 0, big), ("d", 0, 5)))
    versions = PlanVersions(plan((("c", 0, big), ("a", 0, big)), (("d", 0, 5), ("b", 0, 7))))
    layouts = Layouts(index, params, versions, homes_plan=homes_plan)
    layout = layouts.of(versions.for_round(1))
    assert layout.fused == {}  # neither message is a range of the homes: both travel in copies
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.numel(), generator=generator) * 1e3 for p in params]
    for k, message in enumerate(layout.plan.messages):
        members = [grads[index[name]] for name in message.tensors]
        buffers, results, targets, divided = layout.pack(k, message, members, divide_by=3)
        assert divided and results is buffers and [len(t) for t in targets] == [2]
        expected = torch.cat(members).div_(3)
        assert torch.equal(buffers[0], expected)
        assert buffers[0].data_ptr() not in {g.data_ptr() for g in members}  # a copy: the gradients untouched
        plain = layout.pack(k, message, members)
        assert not plain.divided and torch.equal(plain.buffers[0], torch.cat(members))


def test_a_message_reduced_in_place_is_left_for_the_transport_to_divide():
    params = [torch.zeros(4), torch.zeros(2)]
    versions = PlanVersions(plan((("a", 0, 4), ("b", 0, 2))))
    layout = Layouts({"a": 0, "b": 1}, params, versions).of(versions.for_round(1))
    packed = layout.pack(0, layout.plan.messages[0], [params[0], params[1]], divide_by=2)
    assert not packed.divided and packed.results is None and packed.buffers[0] is layout.fused[0]
