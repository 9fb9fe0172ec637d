import pytest

from gradsched.core import CommTask, TaskState, TensorSpec
from gradsched.core.task import IllegalTransition


def spec(numel=10, element_size=4):
    return TensorSpec("w", numel, layer=0, priority=3, element_size=element_size)


@pytest.mark.parametrize("numel,max_bytes", [(10, 16), (10, 40), (10, 4), (7, 8), (1000, 300), (3, 1)])
def test_partition_reassembles_in_element_order(numel, max_bytes):
    root = CommTask(0, spec(numel))
    leaves = root.partition(max_bytes)
    per = max(1, max_bytes // 4)
    assert sum(leaf.numel for leaf in leaves) == numel
    assert [leaf.offset for leaf in leaves] == list(range(0, numel, per))
    assert all(leaf.nbytes <= max(max_bytes, 4) for leaf in leaves)
    assert all(leaf.priority == root.priority for leaf in leaves)
    if len(leaves) > 1:
        assert [leaf.index for leaf in leaves] == list(range(len(leaves)))
        assert len({leaf.id for leaf in leaves} | {root.id}) == len(leaves) + 1


def test_partition_keeps_element_alignment():
    leaves = CommTask(0, spec(10, element_size=8)).partition(20)  # 2 elements of 8 bytes fit
    assert [leaf.numel for leaf in leaves] == [2, 2, 2, 2, 2]


def test_parent_follows_children_through_lifecycle():
    root = CommTask(0, spec(10))
    root.reset()
    a, b, c = root.partition(16)
    root.notify_ready()
    assert {t.state for t in (root, a, b, c)} == {TaskState.READY}
    b.start()
    assert root.state == TaskState.STARTED and a.state == TaskState.READY
    a.start()
    c.start()
    assert b.notify_finish() is None
    assert c.notify_finish() is None
    assert root.state == TaskState.STARTED
    assert a.notify_finish() is root
    assert root.state == TaskState.FINISHED


def test_illegal_transitions_raise():
    root = CommTask(0, spec(10))
    with pytest.raises(IllegalTransition):
        root.start()  # not ready
    root.notify_ready()
    root.start()
    with pytest.raises(IllegalTransition):
        root.start()  # twice
    root.notify_finish()
    with pytest.raises(IllegalTransition):
        root.notify_finish()
    parent = CommTask(1, spec(10))
    parent.partition(8)
    parent.notify_ready()
    with pytest.raises(IllegalTransition, match="partitioned"):
        parent.start()


def test_invalid_tensor_spec():
    with pytest.raises(ValueError, match="numel"):
        TensorSpec("w", 0, layer=0, priority=0)
