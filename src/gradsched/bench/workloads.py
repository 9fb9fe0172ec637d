"""What ``gradsched bench`` trains: small real models, and replay models.

A *replay* model has the real parameter tensors of a large model (from the simulator's
model tables: VGG-16, ResNet-50, a Transformer) and real autograd hooks, but each layer's
compute is a wait of its profiled duration. The CPU stays free during those waits, as it
would while a GPU computes, so the communication of a large model can be measured on a
small machine. Results from replay models are always labelled as such.

Waiting is paced as a device computes (:class:`Pacer`): the CPU work between layers
(autograd, hooks, the Python of an optimizer) is hidden behind the layer before, as kernel
launches are on a GPU, so a replay computes what its profile says; time the thread spends
blocked leaves the device idle. The optimizer of a replay (:class:`ReplayOptimizer`) paces
its update at the device's memory bandwidth instead of doing the arithmetic on the CPU.
Each layer keeps one buffer per gradient and hands it back
to autograd every iteration, which takes it over as the new ``.grad`` (no allocation, no
copy), as a GPU's backward would write fresh gradients. The hooks that keep the buffers run
after a wrapper's hooks, so what is kept is the gradient as the wrapper left it (a view of its
bucket, say), and whatever the wrapper does with ``.grad`` costs what it costs with real gradients.

With a *launch share* each op is also launched by CPU work of that share of its time, done
with real operator calls that take and release the interpreter lock as eager kernel launches
do (:meth:`Pacer.launch`): a wrapper's own Python threads then make the launches, and the
device, late, and the pacer counts the time the launches waited for the interpreter.
"""

from __future__ import annotations

import os
import resource
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..models import MODELS, Layer, ModelTable, ParamSpec, model_table
from ..models.devices import get_device
from ..runtime.torch_private import plain_torch_function

REAL = {
    "mlp": "MLP, 31.5M parameters (1024-2048-4096-4096-1024-10), batch 64",
    "cnn": "small CNN, 1.2M parameters (4 conv + 2 linear, 32x32 inputs), batch 32",
}
REPLAY = {f"replay-{name}": f"replay of {name}" for name in ("vgg16", "resnet50", "transformer")}
REPLAY["replay-mini"] = "replay of a small synthetic model (8 layers, 2.1M parameters, 40 ms compute), for smoke runs"


def mini_table() -> ModelTable:
    """Eight layers of 256K parameters (plus biases), 1.5 ms forward and 3.5 ms backward each."""
    layers = tuple(
        Layer(f"layer{i}", 1.5e-3, 3.5e-3, (ParamSpec(f"layer{i}.weight", 512 * 512), ParamSpec(f"layer{i}.bias", 512)))
        for i in range(8)
    )
    return ModelTable("mini", layers, {"source": "synthetic"})


_SCHEDSTAT = threading.local()


def thread_run_delay() -> float:
    """Seconds this thread has been runnable but waiting for a CPU that others held (the run
    delay in Linux's per-thread scheduler statistics; 0 where they are not available)."""
    fd = getattr(_SCHEDSTAT, "fd", None)
    if fd is None:
        try:
            fd = _SCHEDSTAT.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = _SCHEDSTAT.fd = -1
    return int(os.pread(fd, 128, 0).split()[1]) * 1e-9 if fd >= 0 else 0.0


def thread_busy_time() -> float:
    """Seconds this thread has been running (its CPU time) or runnable (:func:`thread_run_delay`).
    Time spent blocked (sleeping, on a lock, waiting for the interpreter) is not counted."""
    return time.thread_time() + thread_run_delay()


@dataclass
class LaunchWork:
    """What the launch work of a :class:`Pacer` took, in all (seconds)."""

    cpu_s: float = 0.0  # its CPU time
    wall_s: float = 0.0  # from its start to its end
    queued_s: float = 0.0  # runnable, waiting for a CPU (the run delay)
    blocked: int = 0  # times it blocked (voluntary context switches): on the interpreter lock

    @property
    def interpreter_s(self) -> float:
        """Neither running nor queued for a CPU: blocked, and launch work blocks only on the
        interpreter lock that another thread of the process holds (:attr:`blocked` counts
        those), or interrupted (interrupt time is charged to no thread: on loopback the
        network's work runs so, and with both CPUs busy with other processes' work a few
        microseconds per launch are lost so too)."""
        return max(0.0, self.wall_s - self.cpu_s - self.queued_s)


def _voluntary_switches() -> int:
    """This thread's voluntary context switches so far (0 where the platform does not count them)."""
    try:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (AttributeError, OSError):
        return 0


class Pacer:
    """Waits as an accelerator computes: one device *op* per call, the CPU feeding it ahead.

    Each op starts when the previous one ended, plus any time the thread spent blocked
    (waiting on a lock or on communication, not computing) since it got back from the
    previous op. The CPU work the thread did in between (autograd, hooks, an optimizer's
    Python), and the time it waited for a CPU held by other processes (on this 2-core
    machine, the other ranks and the network stack, which a GPU host runs beside its
    devices), are hidden behind the previous op, up to that op's length, as kernel launches
    are on a GPU. A thread blocked on communication leaves the device idle, as it would.
    The thread sleeps until the op ends; waits too short to sleep accurately are carried
    over, and oversleeping is not counted: the next op is timed from the previous one's end,
    not from the late wake-up.
    """

    def __init__(self, quantum: float = 3e-4, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = thread_busy_time, sleep: Callable[[float], None] = time.sleep,
                 launch_share: float = 0.0) -> None:
        if not 0.0 <= launch_share < 1.0:
            raise ValueError(f"launch_share must be in [0, 1), got {launch_share}")
        self.quantum = quantum
        self.clock, self.cpu_clock, self.sleep = clock, cpu_clock, sleep
        self.launch_share = launch_share  # of each op's time, the CPU work that launches it (see launch())
        self.launched = LaunchWork()
        self._scratch = torch.zeros(8)
        self.end: float | None = None  # when the previous op ended (device time, on the wall clock)
        self.resumed = 0.0  # when the thread got back from it
        self.cpu = 0.0  # the thread's CPU time then
        self.previous = 0.0  # the previous op's length
        self.ops = 0
        self.busy_s = 0.0  # device time paced so far
        self.slowdown = 1.0  # every op takes that many times its time (a straggler's burst: gradsched.bench.straggler)

    def launch(self, seconds: float) -> None:
        """The CPU work that launches an op of ``seconds`` in eager PyTorch, ``launch_share`` of
        it: real operator calls on a small tensor until this thread has spent that much CPU
        time. Each call holds the interpreter lock for its Python part and lets go of it in
        its C++ part, as a kernel launch does, so another thread of the process that holds the
        lock meanwhile makes this work, and the op it launches, late."""
        target = self.launch_share * seconds
        wall, cpu, queued, switches = time.perf_counter(), time.thread_time(), thread_run_delay(), _voluntary_switches()
        while time.thread_time() - cpu < target:
            torch.neg(self._scratch, out=self._scratch)
        work = self.launched
        work.cpu_s += time.thread_time() - cpu
        work.wall_s += time.perf_counter() - wall
        work.queued_s += thread_run_delay() - queued
        work.blocked += _voluntary_switches() - switches

    def wait(self, seconds: float) -> None:
        seconds *= self.slowdown
        if self.launch_share:
            self.launch(seconds)  # its CPU time is hidden behind the previous op, its waits are not
        now, cpu = self.clock(), self.cpu_clock()
        if self.end is None:
            start = now
        else:
            hidden = min(cpu - self.cpu, self.previous)  # CPU work done while the device computed
            start = self.end + max(0.0, now - self.resumed - hidden)
        self.end = start + seconds
        self.previous = seconds
        self.ops += 1
        self.busy_s += seconds
        if self.end - now >= self.quantum:
            self.sleep(self.end - now)
        self.resumed, self.cpu = self.clock(), self.cpu_clock()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor FSDP2 shards (a DTensor); a plain tensor is all its own."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class ReplayOptimizer(torch.optim.Optimizer):
    """SGD with momentum as a replay: each ``step()`` is one device op of the time the update
    takes at the device's memory bandwidth (five passes over the updated parameters: read
    parameter, gradient and momentum, write parameter and momentum). Parameters stay as
    they are, so the CPU does no arithmetic a GPU would do; the Python around it is real, and
    so is the momentum's memory (a buffer per parameter, as SGD's state holds it)."""

    PASSES = 5
    gradsched_elementwise = True  # an update of a shard costs the shard's bytes (architecture="sharded")

    def __init__(self, params, pacer: Pacer, bytes_per_second: float) -> None:
        super().__init__(params, {"lr": 1e-3})
        self.pacer = pacer
        self.bytes_per_second = bytes_per_second

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        nbytes = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # this rank's part under FSDP2
                    nbytes += local(p).numel() * p.element_size()
                    if "momentum_buffer" not in self.state[p]:  # held as SGD holds it (never computed on)
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        if nbytes:
            self.pacer.wait(self.PASSES * nbytes / self.bytes_per_second)


class _ReplayOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layer, *params):  # noqa: D401 - autograd signature
        ctx.layer = layer
        layer.pacer.wait(layer.forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        layer = ctx.layer
        layer.pacer.wait(layer.backward_s)
        return (grad, None, *layer.take_gradients())


class ReplayLayer(nn.Module):
    def __init__(self, name: str, forward_s: float, backward_s: float, sizes: list[int], pacer: Pacer):
        super().__init__()
        self.label = name
        self.forward_s = forward_s
        self.backward_s = backward_s
        self.pacer = pacer
        self.weights = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in sizes])
        self._buffers_out: list[torch.Tensor | None] = [None] * len(sizes)
        self._hooks = []
        self._hooked: list[int] = []  # the hooks are registered by the first forward pass (see track_gradients)

    def track_gradients(self) -> None:
        """Register the hooks that keep each gradient buffer for the next iteration (again
        whenever the parameters are replaced: FSDP2 computes with parameters of its own). From
        the first forward pass, so after a wrapper's own hooks: what is kept is the gradient as
        the wrapper left it (gradsched's and DDP's bucket views: a view of their buffer, which
        autograd then accumulates into in place), never autograd's tensor that the wrapper copied
        and let go, which a real model's backward pass would not keep alive."""
        self._hooked = [id(p) for p in self.weights]
        # The hooks live in the parameters, out of sight of Python's cycle collector: they
        # must not hold the layer (which holds the parameters), or no model is ever freed.
        keep = weakref.WeakMethod(self._keep)
        self._hooks = [
            p.register_post_accumulate_grad_hook(lambda p, i=i: keep()(i, p)) for i, p in enumerate(self.weights)
        ]

    def _keep(self, i: int, p: torch.Tensor) -> None:
        self._buffers_out[i] = p.grad

    def take_gradients(self) -> list[torch.Tensor]:
        out = []
        # What a wrapper left in .grad may be a tensor subclass whose every operation first waits
        # (gradsched's gradient in flight): the replay only asks its shape, as a kernel's launch
        # would not wait either, and does not run the subclass's Python for it.
        with plain_torch_function():
            for i, p in enumerate(self.weights):
                buffer = self._buffers_out[i]
                self._buffers_out[i] = None  # autograd must hold the only reference to steal it
                out.append(buffer if buffer is not None and buffer.shape == p.shape else torch.zeros_like(p))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if [id(p) for p in self.weights] != self._hooked:
            self.track_gradients()
        return _ReplayOp.apply(x, self, *self.weights)


class ReplayNet(nn.Module):
    def __init__(self, table: ModelTable, dilation: float = 1.0, launch_share: float = 0.0) -> None:
        """``dilation``: each layer takes that many times its profiled time (gradsched.bench.dilation);
        ``launch_share``: each op's launch holds the interpreter for that share of it (:meth:`Pacer.launch`)."""
        super().__init__()
        self.pacer = Pacer(launch_share=launch_share)
        self.layers = nn.ModuleList(
            ReplayLayer(layer.name, layer.forward_s * dilation, layer.backward_s * dilation,
                        [p.numel for p in layer.params], self.pacer)
            for layer in table.layers
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass
class Workload:
    name: str
    description: str
    replay: bool
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    table: ModelTable | None  # what the simulator predicts with (replay models only)
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] = lambda model: torch.optim.SGD(
        model.parameters(), lr=1e-3, momentum=0.9)


def _mlp() -> nn.Module:
    sizes = [1024, 2048, 4096, 4096, 1024, 10]
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def _classify(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def workload(name: str, batch: int = 32, device: str = "v100", dilation: float = 1.0,
             launch_share: float = 0.0) -> Workload:
    """The workload called ``name`` (see ``REAL`` and ``REPLAY``); a replayed one runs
    ``dilation`` times slower (its ``table`` stays the profile's), each op launched by CPU work
    of ``launch_share`` of its time (:meth:`Pacer.launch`)."""
    if name == "mlp":
        return Workload(name, REAL[name], False, _mlp,
                        lambda g: (torch.randn(64, 1024, generator=g), torch.randint(0, 10, (64,), generator=g)),
                        _classify, None)
    if name == "cnn":
        return Workload(name, REAL[name], False, _cnn,
                        lambda g: (torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)),
                        _classify, None)
    if name in REPLAY:
        table = mini_table() if name == "replay-mini" else model_table(name.removeprefix("replay-"), batch, device)
        detail = "" if name == "replay-mini" else f" ({device}, batch {batch}: {table.compute_s * 1e3:.0f} ms compute)"
        rate = get_device(device).memory_gbs * 1e9 / dilation
        return Workload(name, REPLAY[name] + detail,
                        True, lambda: ReplayNet(table, dilation, launch_share), lambda g: (torch.zeros(1), torch.zeros(1)),
                        lambda out, y: out.sum(), table,
                        lambda model: ReplayOptimizer(model.parameters(), model.pacer, rate))
    known = ", ".join([*REAL, *REPLAY])
    raise ValueError(f"unknown bench model {name!r}; choose from: {known}")


__all__ = ["MODELS", "REAL", "REPLAY", "ReplayNet", "Workload", "workload"]
