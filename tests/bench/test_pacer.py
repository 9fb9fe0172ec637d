"""The replay's pacer, on a simulated clock: device ops back to back, CPU work between them
hidden behind the previous op (up to its length), blocked time and late wake-ups not."""

from __future__ import annotations

import pytest

from gradsched.bench.workloads import Pacer


class Clocks:
    """A wall clock and a thread CPU clock that the test advances; sleeping advances the
    wall clock by what was asked plus a fixed oversleep."""

    def __init__(self, oversleep: float = 0.0) -> None:
        self.wall = self.cpu = 0.0
        self.oversleep = oversleep
        self.slept: list[float] = []

    def work(self, seconds: float) -> None:  # the thread computes
        self.wall += seconds
        self.cpu += seconds

    def block(self, seconds: float) -> None:  # the thread waits (communication, a lock)
        self.wall += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.wall += seconds + self.oversleep

    def pacer(self) -> Pacer:
        return Pacer(quantum=1e-4, clock=lambda: self.wall, cpu_clock=lambda: self.cpu, sleep=self.sleep)


def test_cpu_work_between_ops_is_hidden_and_oversleep_is_not_counted():
    clocks = Clocks(oversleep=0.05e-3)
    pacer = clocks.pacer()
    for _ in range(10):
        clocks.work(0.2e-3)  # autograd and hooks between layers
        pacer.wait(1e-3)
    # ten 1 ms ops back to back after the first op's start (0.2 ms): the CPU work and the
    # oversleep of every wake-up are hidden
    assert pacer.end == pytest.approx(0.2e-3 + 10e-3)
    assert pacer.busy_s == pytest.approx(10e-3) and pacer.ops == 10


def test_cpu_work_longer_than_the_previous_op_delays_the_next():
    clocks = Clocks()
    pacer = clocks.pacer()
    pacer.wait(1e-3)
    clocks.work(3e-3)  # more CPU work than the 1 ms op could hide
    pacer.wait(1e-3)
    assert pacer.end == pytest.approx(1e-3 + 2e-3 + 1e-3)


def test_blocked_time_leaves_the_device_idle():
    clocks = Clocks()
    pacer = clocks.pacer()
    pacer.wait(1e-3)
    clocks.block(5e-3)  # waiting for a reduction
    clocks.work(0.5e-3)
    pacer.wait(1e-3)
    assert pacer.end == pytest.approx(1e-3 + 5e-3 + 1e-3)


def test_short_waits_are_carried_over():
    clocks = Clocks()
    pacer = clocks.pacer()
    for _ in range(3):
        pacer.wait(0.03e-3)  # 0.09 ms in all, below the 0.1 ms quantum: no sleep yet
    assert clocks.slept == [] and pacer.end == pytest.approx(0.09e-3)
    pacer.wait(0.03e-3)
    assert clocks.slept == [pytest.approx(0.12e-3)]


def test_replay_optimizer_paces_the_update_and_leaves_parameters_alone():
    import torch

    from gradsched.bench.workloads import ReplayOptimizer

    clocks = Clocks()
    pacer = clocks.pacer()
    params = [torch.nn.Parameter(torch.ones(1000)), torch.nn.Parameter(torch.ones(500))]
    params[0].grad = torch.ones(1000)  # the second has no gradient: not updated, not paced
    optimizer = ReplayOptimizer(params, pacer, bytes_per_second=1e9)
    optimizer.step()
    assert pacer.busy_s == pytest.approx(5 * 4000 / 1e9)  # five passes over 4000 bytes
    assert all(torch.equal(p, torch.ones_like(p)) for p in params)


def test_a_dropped_replay_model_is_freed_at_once():
    """The bench runs one model per policy in a process: a model that is trained and
    dropped must be freed by reference counting (its gradient hooks live in the parameters,
    where Python's cycle collector cannot see them)."""
    import gc
    import weakref

    from gradsched.bench.workloads import workload

    def train_and_drop():
        work = workload("replay-mini")
        model = work.build()
        optimizer = work.optimizer(model)
        x, y = work.batch(__import__("torch").Generator().manual_seed(0))
        for _ in range(2):
            work.loss(model(x), y).backward()
            optimizer.step()
        return weakref.ref(next(model.parameters()))

    gc.disable()
    try:
        assert train_and_drop()() is None
    finally:
        gc.enable()


def test_a_replay_model_recycles_the_gradients_as_a_wrapper_left_them():
    """A replay's backward pass hands autograd last step's gradient memory back (no allocation),
    as the wrapper left it: a wrapper whose hook (registered before the first forward pass, as
    a wrapper's are) moves each gradient into a buffer of its own must see autograd's tensor
    freed, as a real model's is, and its buffer accumulated into in place; before, the replay
    kept autograd's tensor alive and the bench counted a gradient buffer more for gradsched
    (ResNet-50's replay: 484 MiB against 389)."""
    import weakref

    import torch

    from gradsched.bench.workloads import workload

    work = workload("replay-mini")
    model = work.build()
    x, y = work.batch(torch.Generator().manual_seed(0))
    params = list(model.parameters())
    buffer = torch.zeros(sum(p.numel() for p in params))
    views = dict(zip(map(id, params), buffer.split([p.numel() for p in params])))
    autograds = []

    def into_buffer(p):
        if p.grad.data_ptr() != views[id(p)].data_ptr():
            autograds.append(weakref.ref(p.grad))
            views[id(p)].copy_(p.grad.view(-1))
            p.grad = views[id(p)].view_as(p)

    for p in params:
        p.register_post_accumulate_grad_hook(into_buffer)
    for _ in range(3):
        for p in params:  # zero_grad(set_to_none=True)
            p.grad = None
        work.loss(model(x), y).backward()
        assert all(p.grad.data_ptr() == views[id(p)].data_ptr() for p in params)
    assert len(autograds) == len(params)  # copied once: from the second pass on, accumulated in place
    assert all(ref() is None for ref in autograds)  # and autograd's tensors freed


def test_a_replay_asks_only_the_shape_of_what_a_wrapper_left_in_grad():
    """What a wrapper leaves in ``.grad`` may be a subclass whose every operation first waits
    (gradsched's gradient in flight): the replay's backward pass asks its shape without running
    the subclass's Python, which no real backward pass would run either (it cost gradsched's
    training thread 8 ms an iteration on replay ResNet-50, DDP nothing)."""
    import torch

    from gradsched.bench.workloads import workload

    class Watched(torch.Tensor):
        calls = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            Watched.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    work = workload("replay-mini")
    model = work.build()
    x, y = work.batch(torch.Generator().manual_seed(0))
    work.loss(model(x), y).backward()  # the first pass registers the hooks that keep the gradients
    for p in model.parameters():
        p.grad = p.grad.as_subclass(Watched)
    layer = model.layers[0]
    for i, p in enumerate(layer.weights):
        layer._keep(i, p)
    Watched.calls = 0
    taken = layer.take_gradients()
    assert Watched.calls == 0 and all(type(t) is Watched for t in taken)


def test_launch_work_holds_the_interpreter_and_counts_the_time_it_waits_for_it():
    """With a launch share each op is launched by CPU work of that share of its time, in
    operator calls that take and release the interpreter lock; a thread of the process that
    runs Python meanwhile makes the launches block on the lock, and the pacer counts it."""
    import threading
    import time

    from gradsched.bench.workloads import Pacer

    with pytest.raises(ValueError, match="launch_share"):
        Pacer(launch_share=1.0)
    pacer = Pacer(launch_share=0.5)
    stop = threading.Event()

    def python_spinner() -> None:
        while not stop.is_set():
            sum(range(100))

    spinner = threading.Thread(target=python_spinner)
    spinner.start()
    try:
        started = time.thread_time()
        for _ in range(20):
            pacer.wait(2e-3)
        spent = time.thread_time() - started
    finally:
        stop.set()
        spinner.join()
    work = pacer.launched
    assert work.cpu_s >= 20 * 0.5 * 2e-3 and spent >= work.cpu_s  # the launch work was done, on this thread
    assert work.blocked > 0 and work.interpreter_s > 0  # and it waited for the spinner's interpreter
    assert work.wall_s >= work.cpu_s + work.interpreter_s - 1e-9
