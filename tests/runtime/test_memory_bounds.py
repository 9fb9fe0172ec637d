"""What gradsched's all-reduce holds for gradients: one buffer as large as the gradients, as DDP
with ``gradient_as_bucket_view=True``, through every phase of a run (the profile rounds, both
arms of the measured trial, re-plans).

Counted storage by storage at fixed points of each iteration (after ``zero_grad()``, after
``backward()`` once every reduction completed, after ``step()``): the memory of every
parameter's ``.grad`` together with every flat buffer any plan's layout refers to. Messages
that travel in a copy (not a range of the homes) are in flight only and not counted here: the
backend's threads may hold the last of them past their end (gloo's workers do), which no
count from Python can tell from gradsched's own. (The hand-off's one gradient buffer:
tests/distributed/test_distributed.py, the kept buckets' test.)
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn

import gradsched

WIDTH, LAYERS, STEPS = 256, 4, 14
OPTIONS = dict(profile_rounds=2, trial_rounds=3, trial_pairs=1, replan_every=3)
PARTITIONS = {"partition_bytes": 65536, "credit_bytes": 131072}


def gradient_bytes(model: nn.Module, optimizer, homes_seen: set[int]) -> int:
    storages = {}
    layouts = optimizer._coordinator.backend.exchange._layouts
    homes = [home for layout in list(layouts._made.values()) for home in layout.homes.values()]
    homes_seen.update(home.untyped_storage().data_ptr() for home in homes)
    for view in homes + [p.grad for p in model.parameters() if p.grad is not None]:
        storage = view.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("policy", ["fifo", "bytescheduler", "prophet"])
def test_one_gradient_buffer_through_profile_trial_and_replans(world_of_one, policy):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    wrapped, optimizer = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3), policy,
                                        policy_options=PARTITIONS if policy == "bytescheduler" else None, **OPTIONS)
    generator = torch.Generator().manual_seed(3)
    counts, homes_seen = [], set()
    for _ in range(STEPS):
        optimizer.zero_grad()
        counts.append(gradient_bytes(model, optimizer, homes_seen))
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.synchronize()
        counts.append(gradient_bytes(model, optimizer, homes_seen))
        optimizer.step()
        counts.append(gradient_bytes(model, optimizer, homes_seen))
    stats = optimizer.stats
    optimizer.close()
    assert stats.plans_adopted >= 3  # re-planned: several plans' layouts over the homes
    assert max(counts) <= param_bytes * 1.03, [round(c / param_bytes, 2) for c in counts]
    assert len(homes_seen) == 1  # the same memory under every plan (one chunk: the model is under 25 MiB)


def test_sharded_lets_go_of_each_local_gradient_once_its_reduce_scatters_ended(world_of_one):
    """ZeRO-2's release: once a backward pass's messages have finished, nothing of gradsched's
    holds the rank's whole local gradients (the data plane's board let go of each as its last
    message ended, and ``.grad`` is the DTensor of this rank's shard of the average, over the
    shard-sized buffer); ``zero_grad(set_to_none=True)`` then frees the shard-sized ones (only
    ``.grad`` held them)."""
    import weakref

    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    wrapped, optimizer = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3), "prophet",
                                        architecture="sharded", profile_rounds=2, replan_every=3)
    local = []
    for p in model.parameters():  # the tensor autograd makes for each gradient, before gradsched takes it
        p.register_hook(lambda grad: local.append(weakref.ref(grad)) or grad)
    generator = torch.Generator().manual_seed(3)
    for _ in range(6):
        optimizer.zero_grad()
        local.clear()
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.synchronize()
        board = optimizer._coordinator.backend.exchange.board
        assert all(g is None for g in board.grads)
        assert len(local) == 2 * LAYERS and all(ref() is None for ref in local)  # freed
        assert all(isinstance(p.grad, DTensor) for p in model.parameters())
        optimizer.step()
        averaged = [weakref.ref(p.grad._local_tensor) for p in model.parameters()]
        optimizer.zero_grad(set_to_none=True)  # frees the averaged shards too, as FSDP2's zero_grad does
        assert all(ref() is None for ref in averaged)
    optimizer.close()


@pytest.mark.parametrize("architecture,budget_mb", [("sharded", None), ("fully_sharded", None), ("sharded", math.inf)])
def test_sharded_backward_waits_for_the_link_past_its_gradient_budget(world_of_one, monkeypatch, architecture,
                                                                      budget_mb):
    """ZeRO-2's bound where the link is the slower: a backward pass that holds more than
    ``gradient_budget_mb`` (default: twice the largest gradient) for gradients not yet reduced
    (local ones handed over, messages packed and in flight) waits for the link before it computes
    more, and no plan's message carries more. The link here is held shut until the backward pass
    has either waited for memory or ended, so without that wait (or with an unbounded budget)
    the local gradients pile up for certain."""
    from gradsched.runtime.comm.exchange import Exchange

    torch.manual_seed(0)
    layers = 6
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    largest = WIDTH * WIDTH * 4
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=1e-3), "fifo",
                                        architecture=architecture, gradient_budget_mb=budget_mb, profile_rounds=2)
    exchange = optimizer._coordinator.backend.exchange
    link_open = threading.Event()
    within_budget = Exchange._within_budget

    def waits_for_memory(self):
        if self.board.held_bytes > self.hold_bytes:
            link_open.set()  # the backward pass waits for the link: open it
        within_budget(self)

    monkeypatch.setattr(Exchange, "_within_budget", waits_for_memory)
    launcher = exchange.launcher
    reduce = launcher.transport.reduce

    def shut_link(*args, **kwargs):
        assert link_open.wait(30.0)
        return reduce(*args, **kwargs)

    launcher.transport.reduce = shut_link
    held = []
    for p in model.parameters():  # a gradient computed: what the rank holds before it is handed over
        p.register_hook(lambda grad: held.append(exchange.board.outstanding_bytes) or grad)
    model[0].weight.register_post_accumulate_grad_hook(lambda p: link_open.set())  # the last: backward ends
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        link_open.clear()
        optimizer.zero_grad()
        held.clear()
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.step()
        biases = 4 * WIDTH * 4  # a message (a bucket cut at the budget) may end past it by biases
        if budget_mb is None:  # default: two layers' gradients, held or packed and in flight
            assert max(held) <= 2 * largest + biases, (_, [round(b / largest, 2) for b in held])
        else:  # never waits: three layers handed over before DDP's first bucket (1 MiB) can be packed
            assert max(held) > 3 * largest
    optimizer.close()


def whole_bytes(model: nn.Module) -> int:
    """Bytes of parameters whole on this rank now (a freed one's data is one element)."""
    return sum(p.untyped_storage().nbytes() for p in model.parameters() if p.untyped_storage().nbytes() > 16)


@pytest.mark.parametrize("budget_mb", [None, 64.0])
def test_fully_sharded_holds_whole_parameters_within_its_budget(world_of_one, budget_mb):
    """ZeRO-3: between steps no parameter is whole; during the forward and backward passes the
    whole ones stay within the gather budget (default: the largest module's, here one layer of
    four, as FSDP2 on a host); with a budget above the model's, the forward pass keeps them all for the
    backward pass (FSDP's reshard_after_forward=False) and nothing is gathered twice."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    layer = sum(p.numel() * p.element_size() for p in model[0].parameters())
    seen = []
    for p in model.parameters():  # its gradient computed, before gradsched's hooks (which free a unit
        # whose gradients are all computed): the module's backward pass runs
        p.register_hook(lambda grad: seen.append(("backward", whole_bytes(model))) or grad)
    wrapped, optimizer = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3), "prophet",
                                        architecture="fully_sharded", gather_budget_mb=budget_mb,
                                        profile_rounds=2, replan_every=3)
    for module in model:  # after gradsched's own hooks: the module's parameters are whole here
        module.register_forward_pre_hook(lambda m, args: seen.append(("forward", whole_bytes(model))))
    gatherer = optimizer._coordinator.backend.stepping.gatherer
    generator = torch.Generator().manual_seed(3)
    for _ in range(5):
        optimizer.zero_grad()
        assert whole_bytes(model) == 0
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.step()
        assert whole_bytes(model) == 0
        assert all(p.isnan().all() for p in model.parameters())  # read between steps: NaN, not a crash
    peak = gatherer.peak  # before close(), which leaves every parameter whole
    optimizer.close()
    assert whole_bytes(model) == LAYERS * layer
    during = [b for _, b in seen]
    assert min(during) >= layer  # the module running is whole
    if budget_mb is None:
        assert max(during) <= layer, [round(b / layer, 2) for b in during]
        assert peak <= layer
    else:
        assert max(b for kind, b in seen if kind == "backward") == LAYERS * layer  # kept from the forward pass


@pytest.mark.parametrize("first", [True, False])
def test_fully_sharded_starts_no_reduce_scatter_beside_a_gather(world_of_one, monkeypatch, first):
    """The gathers go first: every gather is issued 30 ms late (in flight meanwhile), and each
    reduce-scatter, once it may start, finds no gather in flight or due. With the rule taken out
    (``first`` False: the reductions start as their plan allows, as before), some start beside
    one: the backward pass frees a unit, and the next one's gather and the freed one's
    reduce-scatter are due at once."""
    import time

    from gradsched.runtime.architectures.sharded import FullySharded, Sharded
    from gradsched.runtime.architectures.sharded.shards import Shards

    if not first:
        monkeypatch.setattr(FullySharded, "before_reducing", Sharded.before_reducing)
    gather_whole = Shards.gather_whole

    def late(self, *args):
        time.sleep(0.03)
        return gather_whole(self, *args)

    monkeypatch.setattr(Shards, "gather_whole", late)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=1e-3), "priority",
                                        architecture="fully_sharded", profile_rounds=2)
    backend = optimizer._coordinator.backend
    gatherer = backend.stepping.gatherer
    reduce_scatter = backend.exchange.launcher.transport.inner
    before = reduce_scatter.before
    beside = []  # at each reduce-scatter's start: whether a gather was in flight or due

    def watched() -> None:
        if before is not None:
            before()
        with gatherer.cond:
            beside.append(gatherer.queue.holds_reductions())

    reduce_scatter.before = watched
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        optimizer.zero_grad()
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.step()
    optimizer.close()
    assert len(beside) >= 4 * LAYERS
    assert not any(beside) if first else any(beside), beside


@pytest.mark.parametrize("architecture", ["fully_sharded", "sharded"])
def test_the_plans_of_measured_rounds_are_made_beside_the_backward_passs_gathers(world_of_one, monkeypatch,
                                                                                  architecture):
    """Fully sharded: once ready times are measured, every plan is made with the backward pass's
    gathers on the link (``make_plan``'s ``gathers``): the units in the order the forward pass ran
    them, their whole bytes and the budget the gatherer uses. Sharded gathers after the step:
    nothing shares its backward pass's link."""
    from gradsched.runtime.planning import planner

    made = []
    make_plan = planner.make_plan

    def recording(*args, **kwargs):
        made.append(kwargs.get("gathers"))
        return make_plan(*args, **kwargs)

    monkeypatch.setattr(planner, "make_plan", recording)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=1e-3), "priority",
                                        architecture=architecture, profile_rounds=2, replan_every=1)
    generator = torch.Generator().manual_seed(3)
    for _ in range(6):
        optimizer.zero_grad()
        wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
        optimizer.step()
    optimizer.close()
    assert len(made) >= 2, made
    if architecture == "sharded":
        assert made == [None] * len(made)
        return
    assert made[0] is None  # nothing measured yet
    layer = 4 * (WIDTH * WIDTH + WIDTH)
    assert all(g is not None for g in made[1:]), made
    assert made[-1].names == tuple((f"{i}.weight", f"{i}.bias") for i in range(LAYERS))
    assert made[-1].sizes == (layer,) * LAYERS and made[-1].budget == layer


def test_fully_sharded_frees_what_autograd_saved_of_a_freed_parameter(world_of_one):
    """A linear layer's forward pass saves a transposed view of its weight for the backward pass:
    freeing the parameter must free that memory too (FSDP2 resizes the storage), else every
    layer stays whole from its forward pass to its backward pass whatever the budget says.
    Counted from autograd's own saved tensors at the end of the forward pass."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    layer = sum(p.numel() * p.element_size() for p in model[0].parameters())
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=1e-3), "fifo",
                                        architecture="fully_sharded", profile_rounds=2)
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        saved = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            saved[storage.data_ptr() or id(storage)] = storage
            return tensor

        optimizer.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean()
        pinned = sum(s.nbytes() for s in saved.values() if s.nbytes() >= WIDTH * WIDTH * 4)
        assert pinned <= 2 * layer, round(pinned / layer, 2)  # what the budget keeps for the backward pass
        loss.backward()
        optimizer.step()
    optimizer.close()


def test_fully_sharded_in_one_process_computes_what_the_model_computes(world_of_one):
    """A module run twice in one forward pass (gathered again for its second call), evaluation
    under no_grad() between steps (gathered, freed, no backward queued), against the same model
    and optimizer unwrapped."""
    import copy

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 4)

        def forward(self, x):
            return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))

    torch.manual_seed(0)
    model = Twice()
    reference = copy.deepcopy(model)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    wrapped, optimizer = gradsched.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3), "fifo",
                                        architecture="fully_sharded", profile_rounds=2)
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        x = torch.randn(8, WIDTH, generator=generator)
        for net, opt in ((wrapped, optimizer), (reference, plain)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        with torch.no_grad():
            assert torch.equal(wrapped(x), reference(x))
        assert whole_bytes(model) == 0
    optimizer.close()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)


class _Outer(nn.Module):
    """A module whose weight its child shares, read again after the child's forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.weight = self.inner.weight
        self.last = nn.Linear(4, 4)
        self.last.weight = self.inner.weight

    def forward(self, x):
        return self.last(self.inner(x) @ self.weight)


def test_fully_sharded_puts_tied_weights_in_one_unit_whole_while_any_of_its_modules_runs(world_of_one):
    """Tied weights (three modules, one inside another, sharing a weight) are one unit, as
    FSDP2 makes them: whole from the first of its modules' forward passes to the end of the
    outermost one (the child's end frees nothing its parent reads after it), and after the step
    every parameter is freed again; the run computes what the unwrapped model computes."""
    import copy

    torch.manual_seed(0)
    reference = _Outer()
    model = copy.deepcopy(reference)
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "fifo",
                                        architecture="fully_sharded")
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
        for net, opt in ((wrapped, optimizer), (reference, ref_opt)):
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        assert whole_bytes(model) == 0
    optimizer.close()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)


def test_fully_sharded_under_activation_checkpointing_computes_what_the_model_computes(world_of_one):
    """Blocks re-run their forward pass inside the backward pass (torch.utils.checkpoint): each
    re-run gathers its units again, and their backward passes find them whole."""
    import copy

    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks, self.head = nn.ModuleList(Block() for _ in range(3)), nn.Linear(64, 2)

        def forward(self, x):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return self.head(x)

    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    wrapped, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "fifo",
                                        architecture="fully_sharded", profile_rounds=2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 64, generator=generator)
        for net, opt in ((wrapped, optimizer), (reference, plain)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        assert whole_bytes(model) == 0
    optimizer.close()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)


def test_the_wrap_time_check_of_equal_parameters_holds_a_chunk_not_copies_of_a_parameter():
    """wrap() compares every parameter's sum and sum of squares across ranks in double
    precision: once a double copy of each parameter and of its square, three times the largest
    parameter's memory at wrap time (VGG-16's first linear layer: 1.6 GB, the peak of a whole
    sharded run); now a chunk at a time, with the same sums."""
    from helpers import LiveTemporaries

    from gradsched.runtime.frontend.checks import value_sums

    p = torch.randn(4 << 20, generator=torch.Generator().manual_seed(0))
    with LiveTemporaries() as live:
        sums = value_sums(p)
    assert live.peak <= 3 * (1 << 20) * 8, live.peak / p.nbytes  # a chunk of doubles, its square, its sums
    assert sums == pytest.approx((float(p.double().sum()), float(p.double().square().sum())), rel=1e-12)


def test_the_model_broadcast_at_the_end_of_join_copies_a_chunk_at_a_time(world_of_one, monkeypatch):
    """join()'s end copies rank 0's parameters to every rank: it flattened every parameter of a
    dtype into one tensor (a copy of the model, 1 P, beside it); now runs of at most the chunk,
    a parameter larger than it broadcast in its own memory, with the same values landing."""
    import torch.distributed as dist
    from helpers import LiveTemporaries

    from gradsched.runtime.comm import broadcast
    from gradsched.runtime.comm.broadcast import broadcast_model, runs

    monkeypatch.setattr(broadcast, "CHUNK_BYTES", 1 << 20)  # the weights (4 and 8 MB) are larger

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 8), nn.Linear(8, 8), nn.Linear(1024, 1024).double())
    before = [p.detach().clone() for p in model.parameters()]
    with LiveTemporaries() as live:
        broadcast_model(model, True, 0, dist.group.WORLD)
    assert live.peak <= 40 * 1024 * 8, live.peak  # the small layers' run, not a copy of any weight
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    sizes = [[t.numel() for t in run] for run in runs([torch.empty(n) for n in (3, 5, 9, 2, 0, 1)], 40)]
    assert sizes == [[3, 5], [9], [2, 0, 1]]  # 4-byte elements: at most 40 bytes a run, a larger one alone
