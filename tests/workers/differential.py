"""Worker: one rank of the differential test (tests/distributed/test_differential.py), a server of
training programs run twice, under torch's DDP and under gradsched, on the same ranks.

The test process draws a program (Hypothesis' stateful testing) and sends it here call by call,
over a local connection; every rank runs each call on its *reference* (torch's
``DistributedDataParallel`` and a plain optimizer) and then on its *replica* (gradsched, through
``gradsched.DistributedDataParallel`` or ``gradsched.wrap``), both built from the same seed, and
answers with what the call gave each (the loss, every gradient read, a clipping norm, a
checkpoint) or the error it raised. The rank stays up across programs: one interpreter, one
process group, many programs.

    python -m workers.differential HOST PORT AUTHKEY_HEX

Messages from the test: ``("begin", config)``, ``("call", name, kwargs)``, ``("end",)`` (compare
everything, then close both), ``("quit",)``. Answers: ``("ok", {"reference": ..., "replica": ...})``
or ``("failed", {"side": "reference"|"replica", "type": ..., "message": ..., "gradsched": bool})``.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradsched
from gradsched import GradschedError
from gradsched.runtime.comm.compression import ddp_hook
from gradsched.runtime.training.inflight import InFlightGrad

#: small partitions and windows: a round is several messages, some queued behind others
POLICY_OPTIONS = {
    "fifo": {"bucket_cap_bytes": 4096, "first_bucket_bytes": 1024},
    "priority": {"partition_bytes": 1024},
    "bytescheduler": {"partition_bytes": 1024, "credit_bytes": 2048},
    "prophet": {"partition_bytes": 512, "credit_bytes": 2048, "fuse_bytes": 1024, "profile_iterations": 2},
}
EMULATION_LATENCY = "0.02"  # GRADSCHED_EMULATE_NCCL: a collective runs 20 ms after it is queued


class Net(nn.Module):
    """A convolution and BatchNorm (buffers), linear layers, a side layer a forward pass may
    leave unused, optionally a float64 layer between float32 ones (messages that pack two
    dtypes), and a frozen parameter."""

    def __init__(self, float64: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.fc1 = nn.Linear(6 * 4 * 4, 24)
        self.side = nn.Linear(24, 24)
        self.mid = nn.Linear(24, 24).double() if float64 else nn.Linear(24, 24)
        self.head = nn.Linear(24, 5)
        self.frozen = nn.Parameter(torch.ones(5), requires_grad=False)

    def forward(self, x: torch.Tensor, use_side: bool = True) -> torch.Tensor:
        x = torch.relu(self.fc1(torch.relu(self.bn(self.conv(x))).flatten(1)))
        if use_side:
            x = x + torch.tanh(self.side(x))
        x = torch.relu(self.mid(x.to(self.mid.weight.dtype))).to(x.dtype)
        return self.head(x) * self.frozen


def batch(seed: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(8, 3, 6, 6, generator=g), torch.randint(0, 5, (8,), generator=g)


def make_optimizer(kind: str, params: list[nn.Parameter], named: list[tuple[str, nn.Parameter]]):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if kind == "nesterov":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    if kind == "adamw-groups":  # two groups with their own settings
        decay = [p for n, p in named if n.endswith("weight")]
        rest = [p for n, p in named if not n.endswith("weight")]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": rest, "lr": 3e-3, "weight_decay": 0.0}], lr=1e-2)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, momentum=0.5)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=0.05)
    raise ValueError(kind)


def replica_options(config: dict) -> dict:
    """gradsched's options for ``config`` (with servers: the last rank serves)."""
    options = dict(policy=config["policy"], policy_options=POLICY_OPTIONS[config["policy"]],
                   find_unused_parameters=config["find_unused"], profile_rounds=1, replan_every=3)
    if config["handoff"]:  # the measured trial keeps the buckets and hands them to DDP's reducer
        options.update(fallback=True, fallback_gain=0.99, trial_rounds=3, trial_pairs=1, trial_extra_pairs=0)
    else:
        options.update(fallback=False)
    if config["architecture"] == "ps":
        options.update(architecture="ps", servers=1)
    elif config["architecture"] != "allreduce":
        options["architecture"] = config["architecture"]
    if config["comm"] == "bf16":
        options["compression"] = "bf16"
    return options


class ParameterServer:
    """The last rank under ``architecture="ps"``: ``gradsched.wrap`` serves (in a thread of its
    own, so that this rank still answers the test) until the workers close."""

    def __init__(self, config: dict) -> None:
        self.error: BaseException | None = None
        torch.manual_seed(config["seed"])
        net = Net(config["float64"])
        named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
        options = replica_options(config)
        optimizer = make_optimizer(config["optimizer"], [p for _, p in named], named)
        if config["emulated"]:
            os.environ["GRADSCHED_EMULATE_NCCL"] = EMULATION_LATENCY

        def serve() -> None:
            try:
                gradsched.wrap(net, optimizer, **options)
            except BaseException as exc:  # noqa: BLE001 - reported at the end
                self.error = exc
            finally:
                os.environ.pop("GRADSCHED_EMULATE_NCCL", None)

        self.thread = threading.Thread(target=serve, name="parameter-server", daemon=True)
        self.thread.start()

    def end(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise TimeoutError(f"the parameter server did not return within {timeout_s:.0f} s of the workers' close")
        if self.error is not None:
            raise self.error


def plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """A detached copy of what code reading ``t`` sees: the whole tensor (a DTensor gathered)."""
    if t is None:
        return None
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().clone().as_subclass(torch.Tensor)


def tensors_of(value: Any) -> Any:
    """``value`` with every tensor replaced by a plain copy (nested dicts and lists kept)."""
    if isinstance(value, torch.Tensor):
        return plain(value)
    if isinstance(value, dict):
        return {k: tensors_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tensors_of(v) for v in value]
    return value


class Side:
    """One way of training the model: the reference (torch's DDP) or the replica (gradsched)."""

    def __init__(self, config: dict, rank: int, reference: bool, workers: Any = None) -> None:
        """``workers``: the workers' group where the world holds parameter servers too (DDP's)."""
        self.config, self.rank, self.reference = config, rank, reference
        self.api = "torch" if reference else config["api"]
        torch.manual_seed(config["seed"])
        self.net = Net(config["float64"])
        self.saved: tuple[dict, dict] | None = None
        find_unused = config["find_unused"]
        named = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        if reference:
            self.model = TorchDDP(self.net, find_unused_parameters=find_unused, process_group=workers)
            self._ddp_hook(self.model, workers)
            self.optimizer = make_optimizer(config["optimizer"], [p for _, p in named], named)
        else:
            options = replica_options(config)
            if config["emulated"]:
                os.environ["GRADSCHED_EMULATE_NCCL"] = EMULATION_LATENCY
            try:
                if self.api == "ddp":
                    self.model = gradsched.DistributedDataParallel(self.net, **options)
                    if config["comm"] == "hook":
                        self.model.register_comm_hook(None, default_hooks.allreduce_hook)
                    self.optimizer = make_optimizer(config["optimizer"], [p for _, p in named], named)
                else:
                    hook = (None, default_hooks.allreduce_hook) if config["comm"] == "hook" else None
                    self.model, self.optimizer = gradsched.wrap(
                        self.net, make_optimizer(config["optimizer"], [p for _, p in named], named),
                        comm_hook=hook, **options)
            finally:
                os.environ.pop("GRADSCHED_EMULATE_NCCL", None)
        self.scheduler = (torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.7)
                          if config["scheduler"] else None)

    def _ddp_hook(self, model: TorchDDP, group: Any) -> None:
        """The hook's state is the group it reduces on (None: every rank)."""
        if self.config["comm"] == "bf16":  # (torch's bf16_compress_hook wants NCCL: the same hook for gloo)
            model.register_comm_hook(group, ddp_hook(torch.bfloat16))
        elif self.config["comm"] == "hook":
            model.register_comm_hook(group, default_hooks.allreduce_hook)

    # -- what the user holds ----------------------------------------------------------------
    def no_sync(self):
        return self.optimizer.no_sync() if self.api == "wrap" else self.model.no_sync()

    def params(self) -> list[nn.Parameter]:
        return list(self.net.parameters())

    def loss(self, seed: int, use_side: bool, second: bool = False) -> torch.Tensor:
        x, y = batch(seed, self.rank)
        out = self.model(x, use_side=use_side)
        loss = nn.functional.cross_entropy(out, y)
        return (loss, out.square().mean()) if second else loss

    # -- the calls ----------------------------------------------------------------------------
    def train(self, seed: int, use_side: list[bool], sync: str, losses: str) -> Any:
        """A forward pass with gradients and its backward pass: ``sync`` "yes", "no_sync" (the
        forward pass inside ``no_sync()``; the backward pass too, or "no_sync_forward" for only
        the forward pass), or "flag" (``require_backward_grad_sync = False``, the DDP API's
        idiom); ``losses`` "one", "sum" (two losses summed) or "retain" (two backward passes, the
        first with ``retain_graph``: DDP's reducer reduces the first, the second adds locally)."""
        side = use_side[self.rank]
        outer = self.no_sync() if sync in ("no_sync", "no_sync_forward") else contextlib.nullcontext()
        if sync == "flag":
            self._set_flag(False)
        try:
            with outer:
                if losses == "one":
                    loss = self.loss(seed, side)
                else:
                    first, second = self.loss(seed, side, second=True)
                    loss = first + 0.1 * second
                if sync != "no_sync_forward":
                    self._backward(losses, loss, first if losses == "retain" else None,
                                   second if losses == "retain" else None)
            if sync == "no_sync_forward":
                self._backward(losses, loss, first if losses == "retain" else None,
                               second if losses == "retain" else None)
        finally:
            if sync == "flag":
                self._set_flag(True)
        return loss.detach()

    def _backward(self, losses: str, loss: torch.Tensor, first: torch.Tensor | None,
                  second: torch.Tensor | None) -> None:
        if losses == "retain":
            first.backward(retain_graph=True)
            (0.1 * second).backward()
        else:
            loss.backward()

    def _set_flag(self, value: bool) -> None:
        if self.api == "wrap":  # wrap's model is the user's module: its own switch is no_sync()
            self._flag_context = getattr(self, "_flag_context", None)
            if not value:
                self._flag_context = self.optimizer.no_sync()
                self._flag_context.__enter__()
            elif self._flag_context is not None:
                self._flag_context.__exit__(None, None, None)
                self._flag_context = None
        else:
            self.model.require_backward_grad_sync = value

    def evaluate(self, seed: int, grad: bool) -> Any:
        """A forward pass without backward: under ``torch.no_grad()`` (``grad`` False), or with
        gradients enabled and its graph dropped."""
        x, _ = batch(seed, self.rank)
        with contextlib.nullcontext() if grad else torch.no_grad():
            return self.model(x).detach()

    def mode(self, train: bool) -> None:
        self.model.train(train)

    def zero(self, how: str) -> None:
        if how == "optimizer":
            self.optimizer.zero_grad()
        elif how == "optimizer_keep":
            self.optimizer.zero_grad(set_to_none=False)
        elif how == "model":
            self.model.zero_grad()
        elif how == "model_keep":
            self.model.zero_grad(set_to_none=False)
        elif how == "module":  # under wrap the model is the module
            getattr(self.model, "module", self.model).zero_grad()
        elif how == "none":
            for p in self.params():
                p.grad = None
        elif how == "zero_":
            for p in self.params():
                if p.grad is not None:
                    p.grad.zero_()
        else:
            raise ValueError(how)

    def step(self, closure_seed: int | None, use_side: list[bool]) -> Any:
        if closure_seed is None:
            return self.optimizer.step()

        def closure():
            self.optimizer.zero_grad()
            loss = self.loss(closure_seed, use_side[self.rank])
            loss.backward()
            return loss

        return self.optimizer.step(closure).detach()

    def read_grads(self) -> Any:
        return [plain(p.grad) for p in self.params()]

    def set_grads(self, seed: int, same: bool = False) -> None:
        """Gradients set by hand (each rank its own: nothing averages them), as code that
        computes its own gradients does; with ``same`` every rank the same ones (as
        torch.distributed.checkpoint's zeros)."""
        g = torch.Generator().manual_seed(7000 + 10 * seed + (0 if same else self.rank))
        for p in self.params():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=g).to(p.dtype)

    def clip(self, how: str, value: float) -> Any:
        params = self.params()
        if how == "norm":
            return torch.nn.utils.clip_grad_norm_(params, value)
        if how == "value":
            return torch.nn.utils.clip_grad_value_(params, value)
        wrapper = self.model if self.api == "ddp" else self.optimizer
        if how == "wrapper_norm":
            if self.reference:
                return torch.nn.utils.clip_grad_norm_(params, value)
            return wrapper.clip_grad_norm_(value)
        if how == "wrapper_value":
            if self.reference:
                return torch.nn.utils.clip_grad_value_(params, value)
            return wrapper.clip_grad_value_(value)
        raise ValueError(how)

    def learning_rate(self, factor: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] *= factor

    def schedule(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def optimizer_state(self) -> dict:
        """The optimizer's whole state: under a sharded architecture each rank holds its shards, and
        ``full_state_dict()`` (a collective) joins them into what the optimizer holds unsharded."""
        scheduled = self.optimizer if self.api == "wrap" else getattr(self.model, "optimizer", None)
        if self.reference or self.config["architecture"] == "allreduce" or scheduled is None:
            return self.optimizer.state_dict()  # (the DDP API binds the optimizer when it first steps)
        return scheduled.full_state_dict(rank0_only=False)  # compared on every rank

    def checkpoint(self) -> Any:
        """``state_dict()`` of the model and the optimizer, kept for :meth:`restore`."""
        model, optimizer = self.model.state_dict(), self.optimizer.state_dict()
        self.saved = (copy.deepcopy(model), copy.deepcopy(optimizer))
        return {"model": tensors_of(_unprefixed(model)), "optimizer": tensors_of(self.optimizer_state())}

    def restore(self) -> None:
        """Load the checkpoint (a copy: torch's optimizers keep the loaded tensors and step them in place)."""
        model, optimizer = copy.deepcopy(self.saved)
        self.model.load_state_dict(model)
        self.optimizer.load_state_dict(optimizer)

    def reset_statistics(self, ranks: list[bool]) -> None:
        """BatchNorm's running statistics reset on the ranks flagged (rank 0's are what the next
        forward pass that syncs buffers broadcasts)."""
        if ranks[self.rank]:
            self.net.bn.reset_running_stats()

    def pause(self, seconds: list[float]) -> None:
        if not self.reference:  # (the reference waits for everything anyway)
            time.sleep(seconds[self.rank])

    # -- the end ------------------------------------------------------------------------------
    def final(self) -> dict:
        """Everything, once every update is applied: parameters, buffers, the optimizer's state,
        every gradient."""
        model = _unprefixed(self.model.state_dict())  # (synchronizes gradsched's replica)
        return {"model": tensors_of(model), "optimizer": tensors_of(self.optimizer_state()),
                "grads": self.read_grads()}

    def facts(self) -> dict:
        """What the run reached (counted by the test, not compared): the hand-off to DDP's reducer."""
        if self.reference:
            return {}
        stats = (self.optimizer if self.api == "wrap" else self.model).stats
        return {"handed_off": stats.handed_off_round is not None, "rounds": stats.rounds}

    def close(self) -> None:
        if not self.reference:
            (self.model if self.api == "ddp" else self.optimizer).close()


def _unprefixed(state: dict) -> dict:
    return {k.removeprefix("module."): v for k, v in state.items()}


CALLS = {"train", "evaluate", "mode", "zero", "step", "read_grads", "set_grads", "clip", "learning_rate",
         "schedule", "checkpoint", "restore", "reset_statistics", "pause"}


def _failure(side: str, exc: BaseException) -> tuple[str, dict]:
    return "failed", {"side": side, "type": type(exc).__name__, "message": str(exc)[:2000],
                      "gradsched": isinstance(exc, GradschedError), "traceback": traceback.format_exc()[-4000:]}


class Server:
    """This rank's side of the test's programs: a worker, or (the last rank of a world with
    parameter servers, under ``architecture="ps"``) a server, which has nothing to call."""

    def __init__(self, connection: Any, rank: int, workers: Any = None) -> None:
        self.connection, self.rank, self.workers = connection, rank, workers
        self.serves = workers is not None and rank >= 2  # the last rank of a world with a server
        self.reference: Side | None = None
        self.replica: Side | None = None
        self.server: ParameterServer | None = None

    def serve(self) -> None:
        while True:
            message = self.connection.recv()
            if message[0] == "quit":
                self._drop(wait=False)
                return
            # tensors by value (Connection.send would share their memory through torch's reductions,
            # which an interpreter not forked from the test's cannot attach to)
            self.connection.send_bytes(pickle.dumps(self.handle(message)))

    def handle(self, message: tuple) -> tuple[str, Any]:
        if self.serves:
            return self._as_server(message)
        kind = message[0]
        if kind == "begin":
            self._drop(wait=False)
            config = message[1]
            try:
                self.reference = Side(config, self.rank, reference=True, workers=self.workers)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                return _failure("reference", exc)
            if config.get("reference_only"):  # (debugging a program: is it one DDP accepts?)
                self.replica = self.reference
                return "ok", {}
            try:
                self.replica = Side(config, self.rank, reference=False)
            except BaseException as exc:  # noqa: BLE001
                return _failure("replica", exc)
            return "ok", {}
        if kind == "call":
            name, kwargs = message[1], message[2]
            assert name in CALLS, name
            results = {}
            for side in ("reference", "replica") if self.replica is not self.reference else ("reference",):
                try:
                    results[side] = tensors_of(getattr(getattr(self, side), name)(**kwargs))
                except BaseException as exc:  # noqa: BLE001
                    return _failure(side, exc)
            results.setdefault("replica", results["reference"])
            return "ok", results
        if kind == "end":
            results = {}
            for side in ("reference", "replica") if self.replica is not self.reference else ("reference",):
                try:
                    results[side] = getattr(self, side).final()
                except BaseException as exc:  # noqa: BLE001
                    return _failure(side, exc)
            results.setdefault("replica", results["reference"])
            results["facts"] = self.replica.facts()
            try:
                self._drop(wait=True)
            except BaseException as exc:  # noqa: BLE001
                return _failure("replica", exc)
            return "ok", results
        if kind == "drop":
            self._drop(wait=False)
            return "ok", {}
        raise ValueError(kind)

    def _as_server(self, message: tuple) -> tuple[str, Any]:
        """Serve from "begin" to "end"; every call in between answers that nothing was called here."""
        kind = message[0]
        if kind == "begin":
            self.server = ParameterServer(message[1])
        elif kind in ("end", "drop") and self.server is not None:
            server, self.server = self.server, None
            try:
                server.end(60.0 if kind == "end" else 10.0)
            except BaseException as exc:  # noqa: BLE001
                if kind == "end":
                    return _failure("replica", exc)
        return "ok", {"reference": None, "replica": None}

    def _drop(self, wait: bool) -> None:
        replica, self.replica, self.reference = self.replica, None, None
        if replica is not None:
            if wait:
                replica.close()
            else:
                with contextlib.suppress(BaseException):
                    (replica.model if replica.api == "ddp" else replica.optimizer).close()


def main() -> None:
    host, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a rank hangs
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # with three ranks the last one is a parameter server: DDP, the reference, trains on the workers' group
    workers = dist.new_group([0, 1]) if dist.get_world_size() == 3 else None
    connection = Client((host, port), authkey=key)
    connection.send(("hello", rank))
    Server(connection, rank, workers).serve()
    connection.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
