"""Each private PyTorch API gradsched uses (gradsched.runtime.torch_private) does, on the installed
PyTorch, what gradsched relies on (CI runs this file on the floor of pyproject's range, the pinned
torch and the newest); each use's probe passes here, and a torch that dropped one is refused at
the wrap, naming the use."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.nn.parallel import DistributedDataParallel

from gradsched.runtime import torch_private as tp

pytestmark = pytest.mark.torch_range  # every torch of pyproject's range (Makefile: test-torch-range)


def test_every_private_use_is_there_on_the_installed_torch():
    assert tp.missing() == [], torch.__version__
    tp.require()


def test_a_torch_without_a_use_is_refused_by_the_uses_name(monkeypatch, world_of_one):
    import gradsched
    from gradsched.runtime.errors import GradschedError

    monkeypatch.delattr(torch._C, "_will_engine_execute_node")
    monkeypatch.setattr(tp, "_CHECKED", [])
    assert tp.missing() == ["will_be_reached: the engine's answer whether a node runs "
                            "(torch._C._will_engine_execute_node)"]
    with pytest.raises(GradschedError, match=r"lacks what gradsched uses .*will_be_reached"):
        gradsched.DistributedDataParallel(nn.Linear(2, 2))


def test_the_grad_scaler_probe_reads_torchs_source(monkeypatch):
    """The probe that can only read: GradScaler's module sets both names on the optimizer."""
    monkeypatch.setattr(tp, "GRAD_SCALER_ATTRIBUTES", ("grad_scale", "no_such_name"))
    assert any(use.startswith("GRAD_SCALER_ATTRIBUTES") for use in tp.missing())


def test_backward_running_and_what_it_will_reach():
    used, unused = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    seen = []

    def hook(_):
        seen.append((tp.backward_running(), tp.will_be_reached(get_gradient_edge(used).node),
                     tp.will_be_reached(get_gradient_edge(unused).node)))

    used.register_hook(hook)
    unused.sum()  # a graph of its own: not part of the backward below
    assert not tp.backward_running()
    (used * 2).sum().backward(inputs=[used])
    assert seen == [(True, True, False)]


def test_subclass_operations_and_futures():
    class Marked(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            with tp.plain_torch_function():
                return func(*args, **(kwargs or {}))

    out = torch.ones(2).as_subclass(Marked) + 1
    assert type(out) is torch.Tensor and out.tolist() == [2.0, 2.0]
    future = torch.futures.Future()
    assert tp.is_future(future) and tp.is_future(torch.futures.collect_all([future])) and not tp.is_future(1)


def test_version_counts_in_place_writes_only():
    t = torch.zeros(4)
    before = tp.version(t)
    t.view(-1)[1:3].copy_(torch.ones(2))  # through a view too: it shares the counter
    assert tp.version(t) == before + 1
    t.sum()
    (t + 1).mul_(2)
    assert tp.version(t) == before + 1


def test_ddps_ignored_names_and_input_mover():
    model = nn.Linear(2, 2)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["bias"])
    assert tp.ddp_ignored(model) == {"bias"} and tp.ddp_ignored(nn.Linear(1, 1)) == set()
    args, kwargs = tp.move_inputs((torch.ones(1), [torch.ones(1)]), {"k": {"t": torch.ones(1)}},
                                  torch.device("meta"), False)
    assert args[0].is_meta and args[1][0].is_meta and kwargs["k"]["t"].is_meta
    assert tp.GRAD_SCALER_ATTRIBUTES == ("grad_scale", "found_inf")


def test_the_default_store_and_ddps_forward_halves(world_of_one):
    store = tp.default_store()
    store.set("gradsched-test", "1")
    assert store.get("gradsched-test") == b"1"
    model = nn.Linear(2, 1)
    ddp = DistributedDataParallel(model)
    args, kwargs = tp.ddp_pre_forward(ddp, (torch.ones(3, 2),), {})
    assert DistributedDataParallel._get_active_ddp_module() is ddp
    out = tp.ddp_post_forward(ddp, model(*args, **kwargs))
    assert DistributedDataParallel._get_active_ddp_module() is None
    out.sum().backward()  # DDP's reducer, prepared by the pre-forward, reduces it
    assert model.weight.grad is not None
    del ddp
    dist.barrier()
