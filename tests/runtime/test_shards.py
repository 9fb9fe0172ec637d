"""gradsched.runtime.architectures.sharded.shards.Shards on its own (no process group): shard coordinates,
rank-major packing with padding, and with compression the wire bytes the plans see and the
master shards (what the optimizer steps) against the rounded parameters."""

from __future__ import annotations

import torch

from gradsched.runtime.architectures.sharded.shards import Shards


def shards(rank: int, world: int = 3, compression: str | None = None) -> Shards:
    params = [torch.arange(7, dtype=torch.float32) + 0.5, torch.arange(3, dtype=torch.float32) + 100.5]
    return Shards(["a", "b"], params, rank, world, compression)


def test_the_plans_see_every_ranks_bytes_of_a_shard_in_the_wire_dtype():
    plain, bf16 = shards(0).specs(), shards(0, compression="bf16").specs()
    assert [(t.name, t.numel, t.element_size) for t in plain] == [("a", 3, 12), ("b", 1, 12)]
    assert [(t.name, t.numel, t.element_size) for t in bf16] == [("a", 3, 6), ("b", 1, 6)]


def test_pack_is_rank_major_with_padding_and_unpack_writes_the_other_ranks_parts():
    s = shards(1)
    slices = [("a", 1, 2), ("b", 0, 1)]  # of every rank's shard: a[r*3+1 : r*3+3], b[r]
    packed = s.pack(slices, [p.view(-1) for p in s.params])
    a, b = s.params
    assert packed.tolist() == [a[1].item(), a[2].item(), b[0].item(),  # rank 0
                               a[4].item(), a[5].item(), b[1].item(),  # rank 1
                               0.0, 0.0, b[2].item()]  # rank 2: a[7], a[8] are padding
    s.unpack(slices, -packed)
    assert a.tolist()[1:3] == [-1.5, -2.5] and a.tolist()[4:6] == [4.5, 5.5]  # rank 1's own part kept
    assert b.tolist() == [-100.5, 101.5, -102.5]


def test_with_compression_the_optimizer_steps_masters_and_every_part_lands_rounded():
    s = shards(0, compression="bf16")
    a = s.params[0]
    master = s.tensors[0]
    assert master.data_ptr() != a.data_ptr() and master.tolist() == a.tolist()[:3]
    master.add_(1e-3)  # an update the bf16 rounding cannot hold exactly
    s.unpack([("a", 0, 3)], torch.cat([master, torch.zeros(6)]).to(torch.bfloat16))
    assert a[:3].tolist() == master.to(torch.bfloat16).float().tolist() != master.tolist()
    s.refresh()  # the gathers wrote the parameter: the master keeps its full precision
    assert master.tolist() == (torch.arange(3) + 0.5 + 1e-3).tolist()
    with torch.no_grad():
        a.copy_(torch.full((7,), 5.0))  # someone else's write (load_state_dict)
    s.refresh()
    assert master.tolist() == [5.0, 5.0, 5.0]


def test_without_compression_the_shards_are_the_parameters_memory():
    s = shards(2)
    assert s.tensors[0].data_ptr() == s.params[0][6:].data_ptr() and s.tensors[0].numel() == 1
    assert s.tensors[1].tolist() == [102.5]


def message(*slices: tuple[str, int, int]):
    from gradsched.core.plan import PlannedMessage

    return PlannedMessage(tuple(slices), 0, None, None, 0.0, 0.0)


def test_a_message_of_one_whole_unpadded_parameter_travels_in_its_gradients_own_memory():
    """No copy where the rank-major buffer would be the gradient itself (a weight alone in a
    message: fifo's large ones); a padded one, or two tensors, are packed."""
    params = [torch.zeros(8), torch.zeros(7)]
    s = Shards(["even", "odd"], params, rank=0, world=2)
    even, odd = torch.arange(8.0), torch.arange(7.0)
    assert s.pack([("even", 0, 4)], [even]).data_ptr() == even.data_ptr()
    assert s.pack([("even", 0, 2)], [even]).data_ptr() != even.data_ptr()  # a part: rank-major is another order
    padded = s.pack([("odd", 0, 4)], [odd])
    assert padded.data_ptr() != odd.data_ptr() and padded.tolist() == [0, 1, 2, 3, 4, 5, 6, 0]


def test_consecutive_slices_of_a_tensor_travel_as_one_piece_received_straight_into_the_shard_buffer():
    """A partitioned tensor's consecutive pieces in one message (prophet's blocks, bytescheduler's
    partitions) join into one slice: packed as before, and on gloo (a Pairwise set), uncompressed,
    this rank's result is received into its place in the shard's gradient buffer (nothing to
    copy back); several tensors in a message, or compression, copy back as before."""
    from gradsched.runtime.architectures.sharded.shards import ShardedLayout

    params = [torch.zeros(8), torch.zeros(4)]
    s = Shards(["a", "b"], params, rank=1, world=2)
    grads = [torch.arange(8.0), torch.arange(4.0) + 10]
    layout = ShardedLayout(s)
    joined = message(("a", 0, 2), ("a", 2, 2))
    buffers, results, targets, _ = layout.pack(0, joined, [grads[0], grads[0]])
    assert buffers[0].data_ptr() == grads[0].data_ptr()  # the two pieces are the whole of a
    # no Pairwise (NCCL's reduce_scatter): the result lands in this rank's part, one view takes it
    assert [t.numel() for t in targets[0]] == [4] and s.into == {} and results[0].tolist() == [4.0, 5.0, 6.0, 7.0]

    s.pairwise = object()  # what Sharded.transport sets on gloo (only its presence is read here)
    buffers, _, targets, _ = layout.pack(1, message(("a", 0, 1), ("a", 1, 1)), [grads[0], grads[0]])
    assert buffers[0].tolist() == [0.0, 1.0, 4.0, 5.0] and targets == [[]]
    into = s.into.pop(id(buffers[0]))
    assert into.data_ptr() == s.grad_buffer(0).data_ptr() and into.numel() == 2

    _, _, targets, _ = layout.pack(2, message(("a", 2, 2), ("b", 0, 2)), grads)
    assert len(targets[0]) == 2 and s.into == {}  # two tensors: received into a buffer, copied back
