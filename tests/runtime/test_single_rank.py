"""The runtime in one process (a real gloo group of one rank): updates must equal plain
PyTorch training exactly, and misuse must fail with a message that says how to fix it."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from torch import nn

import gradsched
from gradsched.runtime import GradschedError

SMALL = {
    "fifo": {"bucket_cap_bytes": 2048, "first_bucket_bytes": 512},
    "priority": {"partition_bytes": 512},
    "bytescheduler": {"partition_bytes": 512, "credit_bytes": 2048},
    "prophet": {"partition_bytes": 256, "credit_bytes": 2048, "fuse_bytes": 1024, "profile_iterations": 2},
}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def batches(n=7):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(6, 10, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(n)]


def make_opt(kind, model):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    if kind == "adamw":
        return torch.optim.AdamW(
            [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
             {"params": [model[0].bias, model[2].bias, model[4].weight, model[4].bias], "lr": 3e-3}], lr=1e-2)
    return torch.optim.Adagrad(model.parameters(), lr=0.05)


def train(model, opt, scheduler=None, data=None):
    for x, y in data or batches():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if scheduler:
            scheduler.step()


def test_stats_report_the_sizes_bytescheduler_derived(world_of_one):
    """One rank probes no link: the plans take the sizes for a link not yet measured, then,
    once the estimate of the timed messages tells per-message from per-byte cost, those it
    derives (for a model of a few KiB, the least slice); the stats say which."""
    from gradsched.core.sizing import CREDIT_SLICES, MIN_PARTITION, UNMEASURED_PARTITION

    model = net()
    model, wrapped = gradsched.wrap(model, make_opt("sgd", model), "bytescheduler", profile_rounds=2, replan_every=2)
    train(model, wrapped)
    options = wrapped.stats.plan_options
    assert options["partition_bytes"] in (MIN_PARTITION, UNMEASURED_PARTITION), options
    assert options["credit_bytes"] == CREDIT_SLICES * options["partition_bytes"]
    wrapped.close()


@pytest.mark.parametrize("policy", list(SMALL))
@pytest.mark.parametrize("kind", ["sgd", "adamw", "adagrad"])
def test_updates_equal_plain_training(world_of_one, policy, kind):
    reference = net()
    opt = make_opt(kind, reference)
    train(reference, opt, torch.optim.lr_scheduler.ExponentialLR(opt, 0.8))
    model = net()
    model, wrapped = gradsched.wrap(model, make_opt(kind, model), policy, policy_options=SMALL[policy],
                                    profile_rounds=2, replan_every=2)
    train(model, wrapped, torch.optim.lr_scheduler.ExponentialLR(wrapped, 0.8))
    wrapped.synchronize()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert wrapped.stats.rounds == 7 and wrapped.stats.plans_adopted >= 2
    options = wrapped.stats.plan_options  # the plan in use reports what it was made with
    assert options and all(options[k] == v for k, v in SMALL[policy].items()), options
    wrapped.close()


@pytest.mark.parametrize("policy", list(SMALL))
def test_step_with_a_closure_is_torch_optims(world_of_one, policy):
    """step(closure), as trainers call it: the closure runs forward and backward with
    gradients enabled, its loss is returned, and the updates equal torch.optim's own."""

    def run(model, opt):
        losses = []
        for x, y in batches():
            def closure():
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                return loss

            losses.append(opt.step(closure).item())
        return losses

    reference = net()
    expected = run(reference, make_opt("sgd", reference))
    model = net()
    model, wrapped = gradsched.wrap(model, make_opt("sgd", model), policy, policy_options=SMALL[policy],
                                    profile_rounds=2, replan_every=2)
    assert run(model, wrapped) == expected
    wrapped.synchronize()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    wrapped.close()


def test_a_closure_without_a_backward_pass_is_refused_unless_one_ran_before(world_of_one):
    model = net()
    model, wrapped = gradsched.wrap(model, make_opt("sgd", model), "fifo")
    x, y = batches(1)[0]
    with pytest.raises(GradschedError, match=r"step\(closure\): no backward pass that communicates ran since"):
        wrapped.step(lambda: nn.functional.cross_entropy(model(x), y))
    nn.functional.cross_entropy(model(x), y).backward()  # manual optimisation: backward, then step(no-op closure)
    assert wrapped.step(lambda: None) is None
    with pytest.raises(GradschedError, match="no backward pass that communicates ran since the last step"):
        wrapped.step(lambda: None)
    wrapped.close()


def test_plan_changes_are_logged(world_of_one, caplog):
    """Every change of policy is said on the "gradsched" logger at INFO (the measured trial
    too: with two ranks, tests/distributed/test_distributed.py)."""
    model = net()
    model, wrapped = gradsched.wrap(model, make_opt("sgd", model), "bytescheduler", profile_rounds=2, replan_every=2)
    with caplog.at_level(logging.INFO, logger="gradsched"):
        train(model, wrapped, data=batches(10))
    first = wrapped.stats.as_dict()["switches"][0][0]
    wrapped.close()
    said = [r.getMessage() for r in caplog.records if r.name == "gradsched" and r.levelno == logging.INFO]
    # one line, the change of policy (re-plans: DEBUG); how many messages the plan has follows this host's timings
    assert len(said) == 1 and re.fullmatch(rf"gradsched: from backward pass {first} on: a bytescheduler plan of \d+ "
                                           r"messages", said[0]), said


def test_a_measured_profile_round_trips_through_the_simulator(world_of_one, tmp_path, capsys):
    """"Would it help my model?": the measured table of a real run, written in the profile
    format, loads in `gradsched simulate` for any cluster."""
    from gradsched.cli import main
    from gradsched.models import ModelTable

    model = net()
    model, wrapped = gradsched.wrap(model, make_opt("sgd", model), "prophet", policy_options=SMALL["prophet"])
    with pytest.raises(GradschedError, match="nothing measured yet"):
        wrapped.export_profile(str(tmp_path / "early.json"))
    with pytest.raises(ValueError, match="does not exist"):
        wrapped.export_profile(str(tmp_path / "no" / "such.json"))
    train(model, wrapped)
    path = wrapped.export_profile(str(tmp_path / "mine.json"), name="my-mlp")
    wrapped.close()
    table = ModelTable.load(path)
    assert table.name == "my-mlp" and [layer.name for layer in table.layers] == ["0", "2", "4"]  # the Linear layers
    assert sum(p.numel for layer in table.layers for p in layer.params) == sum(p.numel() for p in model.parameters())
    # a layer of microseconds may measure 0 once the time it waited for its update is taken off
    assert all(layer.forward_s >= 0 and layer.backward_s >= 0 for layer in table.layers)
    assert sum(layer.forward_s for layer in table.layers) > 0
    capsys.readouterr()
    assert main(["simulate", "--profile", path, "--workers", "64", "--bandwidth", "10Gbit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in out["results"]} >= {"fifo", "prophet"} and all(r["iteration_s"] > 0 for r in out["results"])


def test_updates_are_deferred_until_the_layer_is_used(world_of_one):
    model = net()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "bytescheduler")
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    before = model[4].weight.detach().clone()
    opt.step()
    opt.zero_grad()
    # the reduced gradient is applied at the latest when the layer runs again
    model(x)
    assert not torch.equal(model[4].weight, before)
    assert all(p.grad is None for p in model.parameters())
    opt.close()


def test_state_dict_waits_for_pending_updates(world_of_one):
    model = net()
    reference = net()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "prophet")
    for m, o in ((model, opt), (reference, ref_opt)):
        x, y = batches(1)[0]
        nn.functional.cross_entropy(m(x), y).backward()
        o.step()
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    opt.close()


def test_step_post_hooks_see_updated_parameters(world_of_one):
    model = net()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "bytescheduler")
    seen = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(model[4].bias.detach().clone()))
    x, y = batches(1)[0]
    before = model[4].bias.detach().clone()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert not torch.equal(seen[0], before)
    opt.close()


def test_trace_is_written_per_rank(world_of_one, tmp_path):
    model = net()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "bytescheduler",
                                trace=str(tmp_path / "run.json"))
    train(model, opt)
    opt.close()
    events = json.loads((tmp_path / "run.rank0.json").read_text())["traceEvents"]
    kinds = {e.get("cat") for e in events}
    assert {"message", "forward", "backward", "update"} <= kinds
    forward = [e["name"] for e in events if e.get("cat") == "forward"][:3]
    assert forward == ["0", "2", "4"]  # the Linear layers of the Sequential, in order
    messages = [e for e in events if e.get("cat") == "message"]
    assert all(e["dur"] >= 0 and e["args"]["tensors"] for e in messages)


def test_wrap_needs_an_initialised_process_group():
    model = net()
    with pytest.raises(GradschedError, match="init_process_group"):
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(policy="magic"), ValueError, "unknown policy 'magic'"),
        (dict(policy_options={"credit_bytes": "4MiB", "partition_bytes": "8MiB"}), ValueError, "credit_bytes"),
        (dict(policy_options={"credit": 1}), ValueError, "has no option 'credit'"),
        (dict(profile_rounds=0), ValueError, "profile_rounds must be >= 1"),
        (dict(timeout=0), ValueError, "timeout must be > 0"),
        (dict(architecture="ring"), ValueError, "architecture must be 'allreduce', 'ps', 'sharded' or 'fully_sharded'"),
        (dict(architecture="ps"), ValueError, "needs servers >= 1"),
        (dict(servers=2), ValueError, "servers only apply to architecture='ps'"),
        (dict(architecture="ps", servers=1), GradschedError, "cannot hold 1 servers and at least one worker"),
        (dict(profile_rounds="3"), TypeError, "profile_rounds must be int, got '3'"),
        (dict(timeout="30s"), TypeError, r"timeout must be float \(seconds\), got .30s."),
        (dict(trace="/no/such/dir/run.json"), ValueError, "trace='/no/such/dir/run.json' folder '/no/such/dir' does not"),
        (dict(trace="/"), ValueError, "is a folder; give a file name"),
        (dict(policy="fifo", autotune=True), ValueError, "nothing to tune for policy 'fifo'"),
        (dict(autotune=True, autotune_space={"partition_bytes": "big"}), ValueError, "LOW:HIGH"),
        (dict(autotune=True, autotune_space={"credit": "1MiB:2MiB"}), ValueError, "has no option 'credit'"),
        (dict(autotune_space={"partition_bytes": "1MiB:2MiB"}), ValueError, "pass autotune=True"),
    ],
)
def test_invalid_configuration(world_of_one, kwargs, error, match):
    model = net()
    with pytest.raises(error, match=match):
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_misuse_is_reported(world_of_one):
    model = net()
    with pytest.raises(GradschedError, match="LBFGS"):
        gradsched.wrap(model, torch.optim.LBFGS(model.parameters()))
    with pytest.raises(GradschedError, match="not in the model"):
        gradsched.wrap(model, torch.optim.SGD(net().parameters(), lr=0.1))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(GradschedError, match="no trainable parameters"):
        gradsched.wrap(frozen, torch.optim.SGD(frozen.parameters(), lr=0.1))
    model, earlier = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))  # takes over, as DDP allows
    for use in (earlier.step, earlier.zero_grad, lambda: earlier.no_sync().__enter__()):
        with pytest.raises(GradschedError, match="wrapped again since"):
            use()
    with pytest.raises(GradschedError, match="already wrapped"):
        gradsched.wrap(net(), opt)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(lambda: 0.0)
    with pytest.raises(RuntimeError, match="cannot be added"):
        opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})
    opt.close()


def test_a_second_backward_pass_over_one_forward_pass_adds_locally(world_of_one):
    """As DDP's reducer: the first backward pass after a forward pass that syncs communicates, a
    second one over the same graph (retain_graph) adds its gradient to the reduced one (on one
    rank the average is the gradient itself: twice the gradient)."""
    reference = net()
    x, y = batches(1)[0]
    nn.functional.cross_entropy(reference(x), y).backward()
    model = net()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "prophet",
                                policy_options=SMALL["prophet"])
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    loss.backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, 2 * q.grad, rtol=0, atol=0)
    opt.close()


def test_unused_parameters_need_the_flag(world_of_one):
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    model = Skip()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(GradschedError, match="find_unused_parameters=True"):
        opt.step()
    opt.close()

    model = Skip()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1),
                                find_unused_parameters=True)
    before = model.unused.weight.detach().clone()
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    assert torch.equal(model.unused.weight, before)  # no gradient anywhere: no update, no decay
    assert model.unused.weight.grad is None
    opt.close()


def test_amp_grad_scaler_after_synchronize(world_of_one):
    """GradScaler reads every gradient (inf check, unscaling): synchronize() first."""
    def run(wrapped: bool):
        model = net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if wrapped:
            model, opt = gradsched.wrap(model, opt, "prophet", policy_options=SMALL["prophet"], profile_rounds=2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step, (x, y) in enumerate(batches()):
            opt.zero_grad()
            scale = float("inf") if step == 3 else 1.0  # an overflowing step (for certain) must be skipped
            scaler.scale(nn.functional.cross_entropy(model(x), y) * scale).backward()
            if wrapped:
                opt.synchronize()
            scaler.step(opt)
            scaler.update()
        if wrapped:
            opt.synchronize()
            opt.close()
        return [p.detach().clone() for p in model.parameters()], scaler.get_scale()

    (plain, plain_scale), (ours, our_scale) = run(False), run(True)
    assert our_scale == plain_scale < 2.0**10  # the overflow was seen and the scale lowered
    for a, b in zip(ours, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class HeldElsewhere(nn.Module):
    """Parameters held by containers whose forward never runs (ParameterList) or used by a
    parent module directly: their updates must still land before they are read."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.scale = nn.Parameter(torch.ones(10))
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x * self.scale)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(10, 10) * 0.3), nn.Parameter(torch.zeros(10))])

    def forward(self, x):
        return torch.tanh(x @ self.weights[0] + self.weights[1])


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet"])
def test_parameters_in_containers_are_updated_before_use(world_of_one, policy):
    reference = HeldElsewhere()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    train(reference, ref_opt)
    model = HeldElsewhere()
    model, opt = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), policy,
                                policy_options=SMALL[policy], profile_rounds=2, replan_every=2)
    train(model, opt)
    opt.synchronize()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # each block waits for its own container's parameters, not the whole model
    waits = {opt._coordinator.backend.waits.name[m]: len(idx) for m, idx in opt._coordinator.backend.waits.of.items()}
    assert waits["blocks.0"] == 2 and waits["blocks.2"] == 2 and waits[""] == 1  # the root holds `scale`
    opt.close()


def test_parameter_servers_refuse_non_cpu_parameters(world_of_one):
    model = net().to("meta")  # stands for CUDA here: any non-CPU device
    with pytest.raises(GradschedError, match="CPU tensors over gloo"):
        gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), architecture="ps", servers=1)


@pytest.mark.parametrize("policy", list(SMALL))
def test_close_frees_parameters_and_buffers_without_a_garbage_collection(world_of_one, policy):
    """A run that is closed and dropped frees its memory at once: no reference cycle of
    gradsched's keeps the parameters, their gradients' flat buffers or the optimizer's state
    alive until Python's cycle collector happens to run (which counts objects, not bytes:
    a bench running policies one after another grew by a model's worth per policy)."""
    import gc
    import weakref

    def run():
        model = net()
        model, wrapped = gradsched.wrap(model, make_opt("adamw", model), policy, policy_options=SMALL[policy],
                                        profile_rounds=2, replan_every=2, trial_rounds=3)
        train(model, wrapped, data=batches(12))
        assert wrapped.stats.plans_adopted >= 2  # several plans, so several layouts, were made
        grad = model[0].weight.grad
        wrapped.close()
        return weakref.ref(model[0].weight), weakref.ref(grad), weakref.ref(wrapped)

    run()  # first use: imports and caches of torch's own
    gc.collect()
    gc.disable()
    try:
        param, grad, wrapped = run()
        assert wrapped() is None and param() is None and grad() is None
    finally:
        gc.enable()
