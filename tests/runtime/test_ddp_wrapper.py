"""gradsched.DistributedDataParallel in one process (a real gloo group of one rank): the model
is wrapped before its optimizer exists, and training must equal plain PyTorch exactly;
DDP's options and misuse give one clear error each."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import gradsched
from gradsched.runtime import GradschedError
from gradsched.runtime.training.inflight import InFlightGrad

from test_single_rank import SMALL, batches, net


def loss_of(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def script(model, clip=None):
    """A plain PyTorch loop: optimizer and LR scheduler built after the wrap, a closure every
    third step, torch's own clipping."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    losses = []
    for k, batch in enumerate(batches()):
        if k % 3 == 0:
            def closure():
                optimizer.zero_grad()
                loss = loss_of(model, batch)
                loss.backward()
                return loss
            losses.append(optimizer.step(closure).item())
        else:
            optimizer.zero_grad()
            loss_of(model, batch).backward()
            if clip:
                clip(model)
            optimizer.step()
        scheduler.step()
    return optimizer, losses


@pytest.mark.parametrize("policy", list(SMALL))
def test_equals_plain_pytorch_with_the_optimizer_built_after_the_wrap(world_of_one, policy):
    reference = net()
    _, reference_losses = script(reference, clip=lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3))
    model = gradsched.DistributedDataParallel(net(), policy=policy, policy_options=SMALL[policy], fallback=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the LR scheduler must not see step() overridden or skipped
        optimizer, losses = script(model, clip=lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3))
    assert losses == reference_losses
    assert model.optimizer is not None and model.optimizer.wrapped is optimizer
    state = model.state_dict()
    assert list(state) == [f"module.{k}" for k in reference.state_dict()]
    for k, v in reference.state_dict().items():
        assert torch.equal(state[f"module.{k}"], v), k
    assert optimizer.state_dict()["state"].keys() == set(range(6))
    model.close()


def test_checkpoints_load_both_ways(world_of_one):
    ddp_style = {f"module.{k}": v + 1.0 for k, v in net().state_dict().items()}
    model = gradsched.DistributedDataParallel(net())
    model.load_state_dict(ddp_style)
    assert all(torch.equal(model.module.state_dict()[k[7:]], v) for k, v in ddp_style.items())
    plain = net()
    plain.load_state_dict({k[7:]: v for k, v in model.state_dict().items()})
    assert torch.equal(plain[0].weight, model.module[0].weight)
    model.close()


def test_gradients_on_the_wire_read_as_reduced(world_of_one):
    """Right after backward, .grad may still be in flight; any read waits for it and gives
    the reduced value, after which .grad is a plain tensor again."""
    model = gradsched.DistributedDataParallel(net(), policy="bytescheduler", fallback=False)
    loss_of(model, batches(1)[0]).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(isinstance(g, InFlightGrad) for g in grads)  # until the training thread sees them reduced
    norm = torch.stack([g.norm() for g in grads]).norm()
    assert all(type(p.grad) is torch.Tensor for p in model.parameters())
    reference = net()
    loss_of(reference, batches(1)[0]).backward()
    assert torch.equal(norm, torch.stack([p.grad.norm() for p in reference.parameters()]).norm())
    model.close()


def test_clip_value_is_applied_once_each_gradient_is_reduced(world_of_one):
    reference = net()
    loss_of(reference, batches(1)[0]).backward()
    torch.nn.utils.clip_grad_value_(reference.parameters(), 0.01)
    model = gradsched.DistributedDataParallel(net(), policy="prophet", fallback=False)
    loss_of(model, batches(1)[0]).backward()
    model.clip_grad_value_(0.01)
    total = model.clip_grad_norm_(1e9)  # waits for all, clips nothing, returns the norm
    assert torch.equal(total, torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9))
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)
    model.close()


def test_the_policy_comes_from_the_environment_when_not_given(world_of_one, monkeypatch):
    monkeypatch.setenv("GRADSCHED_POLICY", "prophet")
    model = gradsched.DistributedDataParallel(net())
    assert model.stats.policy == "prophet"
    model.close()


@pytest.mark.parametrize("options, error, match", [
    ({"bucket_cap_mbb": 10}, TypeError, "did you mean 'bucket_cap_mb'"),
    ({"mixed_precision": object()}, GradschedError, "mixed_precision= is not supported"),
    ({"process_group": object()}, TypeError, "process_group must be a torch.distributed.ProcessGroup"),
    ({"process_group": "world", "device_mesh": object()}, GradschedError, "process_group or device_mesh, not both"),
    ({"device_ids": [0]}, GradschedError, "device_ids=\\[0\\] must name the one device"),
    ({"dim": 1}, GradschedError, "dim=1"),
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb must be > 0"),
    ({"policy": "fastest"}, ValueError, "unknown policy 'fastest'"),
    ({"exit_server": False}, TypeError, "no longer takes 'exit_server': on a parameter-server rank wrap"),
    ({"architecture": "ps", "servers": 1}, GradschedError, "parameter servers .architecture='ps'. need gradsched.wrap"),
    ({"architecture": "ring"}, ValueError, "architecture must be 'allreduce', 'ps', 'sharded' or 'fully_sharded', got 'ring'"),
    ({"replan_evry": 3}, TypeError, "^gradsched.DistributedDataParallel\\(\\) got an unknown option 'replan_evry'"),
    ({"timeout": "soon"}, TypeError, "^gradsched.DistributedDataParallel: timeout must be float"),
])
def test_bad_ddp_options_give_one_clear_error(world_of_one, options, error, match):
    with pytest.raises(error, match=match):
        gradsched.DistributedDataParallel(net(), **options)


def test_ddp_options_with_no_effect_are_accepted(world_of_one):
    model = gradsched.DistributedDataParallel(net(), device_ids=None, static_graph=True, gradient_as_bucket_view=True,
                                              check_reduction=False, bucket_cap_mb=1, mixed_precision=None)
    model.close()


def test_misuse_gives_one_clear_error_each(world_of_one):
    model = gradsched.DistributedDataParallel(net(), policy="bytescheduler")
    # before any backward pass, as torch's over parameters with no gradient: the norm 0, nothing clamped
    assert model.clip_grad_norm_(1.0).item() == torch.nn.utils.clip_grad_norm_(net().parameters(), 1.0).item() == 0
    model.clip_grad_value_(1.0)
    with pytest.raises(TypeError, match="hook must be callable"):
        model.register_comm_hook(None, "allreduce")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GradschedError, match="no backward pass that communicates ran"):
        optimizer.step(lambda: None)
    loss_of(model, batches(1)[0]).backward()
    with pytest.raises(ValueError, match="clip_value must be >= 0"):
        model.clip_grad_value_(-1.0)
    second = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    with pytest.raises(GradschedError, match="a second optimizer steps this model's parameters"):
        second.step()
    torch.optim.SGD(net().parameters(), lr=0.1).step()  # an optimizer of another model is left alone
    with pytest.raises(GradschedError, match="register the hook before the first backward pass"):
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    model.close()


def test_a_communication_hook_is_registered_once_and_not_with_compression(world_of_one):
    model = gradsched.DistributedDataParallel(net(), policy="prophet")
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(GradschedError, match="registered already"):
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    model.close()
    compressed = gradsched.DistributedDataParallel(net(), compression="bf16")
    with pytest.raises(GradschedError, match="compression='bf16' and a communication hook both decide"):
        compressed.register_comm_hook(None, default_hooks.bf16_compress_hook)
    compressed.close()


def test_lbfgs_is_refused_when_it_first_steps(world_of_one):
    model = gradsched.DistributedDataParallel(net())
    optimizer = torch.optim.LBFGS(model.parameters())
    with pytest.raises(GradschedError, match="LBFGS"):
        optimizer.step(lambda: loss_of(model, batches(1)[0]))
    model.close()


def test_graph_breaks_under_compile_are_the_hooks_only(world_of_one):
    """At most one graph break per forward hook gradsched adds (each layer's wait for its
    update, and the root's two), none inside them: the hooks run untraced. (A container's
    loop may fold several into one: this Sequential shows 2.)"""
    import torch._dynamo

    x = batches(1)[0][0]
    torch._dynamo.reset()
    assert torch._dynamo.explain(net())(x).graph_break_count == 0
    model = gradsched.DistributedDataParallel(net())
    explained = torch._dynamo.explain(model)(x)
    layers = sum(1 for m in model.module.modules() if list(m.parameters(recurse=False)))
    assert 0 < explained.graph_break_count <= layers + 2
    model.close()


def test_errors_name_what_the_user_called(world_of_one):
    """Through DistributedDataParallel, an error names it, not gradsched.wrap (which it calls)."""
    with pytest.raises(GradschedError, match="^gradsched.DistributedDataParallel: the model has no trainable"):
        gradsched.DistributedDataParallel(nn.Module())
    with pytest.raises(GradschedError, match="^gradsched.wrap: the model has no trainable"):
        gradsched.wrap(nn.Linear(2, 2).requires_grad_(False), torch.optim.SGD([torch.zeros(1, requires_grad=True)]))


def test_forward_sync_buffers_as_ddp(world_of_one):
    model = gradsched.DistributedDataParallel(net(), forward_sync_buffers=False)
    assert model.forward_sync_buffers is False and model.broadcast_buffers is False
    model.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradsched.DistributedDataParallel(net(), broadcast_buffers=True).close()
        gradsched.DistributedDataParallel(net()).close()
    deprecated = [w for w in caught if issubclass(w.category, FutureWarning) and "broadcast_buffers" in str(w.message)]
    ddp_deprecates = "forward_sync_buffers" in __import__("inspect").signature(
        torch.nn.parallel.DistributedDataParallel.__init__).parameters
    assert len(deprecated) == (1 if ddp_deprecates else 0)  # as the installed DDP: only when passed


def test_a_wrapped_module_again_takes_over_and_pickles(world_of_one, tmp_path):
    """DDP lets a module be wrapped again, and pickles its wrapper: so does gradsched."""
    module = net()
    first = gradsched.DistributedDataParallel(module)
    second = gradsched.DistributedDataParallel(module)
    with pytest.raises(GradschedError, match="wrapped again since"):
        first.no_sync().__enter__()
    reference = net()
    for model in (second, reference):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in batches(3):
            optimizer.zero_grad()
            loss_of(model, batch).backward()
            optimizer.step()
    torch.save(second, tmp_path / "wrapper.pt")
    loaded = torch.load(tmp_path / "wrapper.pt", weights_only=False)
    assert type(loaded) is gradsched.DistributedDataParallel and loaded.module is not second.module
    for ours, theirs in zip(loaded.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    x = batches(1)[0][0]
    torch.testing.assert_close(loaded(x), reference(x), rtol=0, atol=0)
    loaded.close()
    second.close()
    first.close()  # closed already by the take-over: nothing to do


def test_a_model_under_wrap_pickles_with_inert_hooks(world_of_one, tmp_path):
    """gradsched's hooks on the model save as no-ops: torch.save(model) works under wrap too
    (after synchronize(), which applies the pending updates: pickling reads parameters)."""
    model = net()
    model, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss_of(model, batches(1)[0]).backward()
    optimizer.step()
    optimizer.synchronize()
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = batches(1)[0][0]
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    optimizer.close()


def test_it_is_a_torch_ddp_and_unwraps_as_one(world_of_one):
    """``isinstance(model, DDP)``, the unwrapping helpers of scripts and of Accelerate, and what
    code reads on a DDP object; DDP's reducer methods raise naming themselves."""
    from accelerate.utils import extract_model_from_parallel

    inner = net()
    model = gradsched.DistributedDataParallel(inner, policy="fifo")
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert (model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model) is inner
    assert extract_model_from_parallel(model) is inner
    assert model.process_group is torch.distributed.group.WORLD and model.device_ids is None
    assert model.device == torch.device("cpu") and model.dim == 0 and not model.find_unused_parameters
    assert model.require_backward_grad_sync and model.require_forward_param_sync and model.will_sync_module_buffers() \
        is False  # no buffers in this net
    assert model._distributed_rank == 0 and model.bucket_bytes_cap == 25 << 20
    assert model.train() is model and model.training
    with pytest.raises(GradschedError, match=r"_set_static_graph\(\) is DDP's and acts on DDP's C\+\+ reducer"):
        model._set_static_graph()
    with pytest.raises(AttributeError, match="'reducer': it belongs to DDP's C\\+\\+ reducer"):
        model.reducer
    assert not hasattr(model, "reducer") and not hasattr(model, "no_such_thing")
    model.close()


class _Recorder(nn.Module):
    """Records the devices of its (nested) inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.seen: list[str] = []

    def forward(self, x, pair, extra=None):
        self.seen = [str(t.device) for t in (x, *pair, extra["t"])]
        return self.lin(torch.ones(1, 3))


def test_device_ids_move_nested_inputs_to_the_device_as_ddp(world_of_one):
    """With ``device_ids``, tensors nested in args and kwargs reach the module on the wrapper's
    device (DDP's own mover): shown with the device set to ``meta``, so a move is visible on CPU;
    without ``device_ids`` nothing moves, as DDP."""
    plain = gradsched.DistributedDataParallel(_Recorder(), policy="fifo")
    plain(torch.zeros(1), (torch.zeros(1), torch.zeros(1)), extra={"t": torch.zeros(1)})
    assert plain.module.seen == ["cpu"] * 4
    plain.close()
    model = gradsched.DistributedDataParallel(_Recorder(), device_ids=[torch.device("cpu")], policy="fifo")
    assert model.device_ids == [torch.device("cpu")]
    model.device = torch.device("meta")  # where DDP would move them: the mechanism, seen on a CPU machine
    model(torch.zeros(1), (torch.zeros(1), torch.zeros(1)), extra={"t": torch.zeros(1)})
    assert model.module.seen == ["meta"] * 4
    model.close()
