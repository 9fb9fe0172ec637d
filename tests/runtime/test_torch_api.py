"""runtime/torch_api.py: the calls whose name or options moved between supported torch versions,
chosen by what the installed torch offers, work on it; and where torch sorts a group's ranks
(before 2.13), a group that needs another order is refused by name, not made wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gradsched.runtime import torch_api
from gradsched.runtime.errors import GradschedError

pytestmark = pytest.mark.torch_range  # every torch of pyproject's range (Makefile: test-torch-range)


def test_the_collectives_chosen_gather_and_scatter_on_this_torch(world_of_one):
    mine = torch.arange(4.0)
    gathered = torch.empty(4)
    torch_api.all_gather_single(gathered, mine)
    assert torch.equal(gathered, mine)
    # gloo has no reduce-scatter of one tensor (sharding's own pairwise one replaces it there): the name only
    assert torch_api.reduce_scatter_single in (getattr(dist, "reduce_scatter_single", None), dist.reduce_scatter_tensor)
    group = torch_api.new_group([0], None, timedelta(seconds=30))
    assert dist.get_process_group_ranks(group) == [0]
    local = torch_api.new_group([0], "gloo", timedelta(seconds=30), local=True)
    assert dist.get_rank(local) == 0


def test_without_sort_ranks_a_group_in_another_order_is_refused(world_of_one, monkeypatch):
    monkeypatch.setattr(torch_api, "KEEPS_ORDER", False)
    with pytest.raises(GradschedError, match="needs torch 2.13 or newer"):
        torch_api.new_group([1, 0], None, timedelta(seconds=30))
    group = torch_api.new_group([0], None, timedelta(seconds=30))  # ascending: made as torch makes it
    assert dist.get_process_group_ranks(group) == [0]
