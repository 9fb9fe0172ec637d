"""Differential testing against torch's DDP over generated training programs.

:class:`Program` is a Hypothesis rule-based state machine: each example draws a configuration
(the API, the policy, the architecture, the optimizer, compression, the hand-off, gloo or NCCL's
semantics emulated) and then a program of the calls users make between and around
``backward()`` and ``step()``. Every call runs on two real gloo ranks (:class:`Cluster`: the rank
processes of ``workers/differential.py``, started once and reused by every example), first under
torch's ``DistributedDataParallel`` and then under gradsched, and what each gave (losses, every
gradient read, clipping norms, checkpoints; at the end parameters, buffers, the optimizer's state
and every gradient) must be equal: exactly, since with two ranks every sum is of two terms
(commutative in floating point), each divided by two (exact), and gradsched runs the user's own
optimizer on the same tensors (elementwise: the same arithmetic on any subset of them).

Programs are drawn only as torch's DDP accepts them (a precondition says where it would raise: a
second backward pass over a forward pass that synchronized, a parameter unused without
``find_unused_parameters``); the reference raising is a defect of this module. gradsched may
refuse a call only with a :class:`~gradsched.GradschedError` whose message is one of
:data:`REFUSALS` (documented in docs/architectures.md, "Sharded", and docs/testing.md); that ends the program.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import secrets
import signal
import tempfile
import threading
import time
from collections import Counter
from multiprocessing.connection import Listener
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from workers.launch import start_ranks

POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
ARCHITECTURES = ("allreduce", "sharded", "fully_sharded")
OPTIMIZERS = ("sgd", "nesterov", "adam", "adamw-groups", "rmsprop", "adagrad")
ZEROS = ("optimizer", "optimizer_keep", "model", "model_keep", "module", "none", "zero_")
CLEARED = ("optimizer", "model", "module", "none")  # the ways that leave .grad None
SYNCS = ("yes", "no_sync", "no_sync_forward", "flag")
PAUSES = (0.0, 0.0, 0.002, 0.01, 0.03)  # seconds; the emulated collectives run 20 ms after queued

#: The refusals a program may meet: gradsched's documented GradschedErrors (docs/guide.md), each a
#: pattern of its message. Anything else gradsched raises is a failure.
REFUSALS: dict[str, str] = {
    "fully sharded refuses find_unused_parameters": r"does not support find_unused_parameters=True",
    "sharded architectures refuse a communication hook": r"comm(unication)?[ _]hook",
    "fully sharded refuses compression": r"'fully_sharded' does not support compression='bf16' yet",
    "sharded: a later backward pass over a forward pass that communicated": r"a second backward pass over a forward",
    "sharded: step() on gradients not averaged": r"step\(\) on gradients this rank holds alone",
    "sharded: a backward pass under no_sync() onto averaged gradients": r"a backward pass under no_sync\(\)",
}

#: Sharded, two things cannot repeat DDP's arithmetic: a backward pass onto an averaged gradient (no
#: zero_grad() between) adds its own average to this rank's shard of the old one, old + (a + b) / 2,
#: where DDP averages the sums, (old + a) / 2 + (old + b) / 2 (a shard cannot hold the old average
#: whole to add before the reduction); and the global norm of averaged gradients is summed from the
#: shards' norms (as FSDP2's), not from each whole gradient's. Equal up to rounding: from such a call
#: on the program is compared within this, relative to each tensor's largest magnitude (at least 1);
#: everywhere else exactly.
SHARDED_TOLERANCE = 1e-5

STATS: Counter = Counter()  # programs, calls, refusals: what the runs of this process drew


class Hang(AssertionError):
    """The ranks did not answer in time."""


class Cluster:
    """The ranks that run programs: ``world`` processes of ``workers/differential.py`` and a
    connection to each, started once and kept for every example (an interpreter that imports
    torch costs seconds; a program, well under one)."""

    def __init__(self, world: int = 2, env: dict | None = None,
                 timeout_s: float = float(os.environ.get("GRADSCHED_PROGRAMS_TIMEOUT", "120"))) -> None:
        self.world, self.env, self.timeout_s = world, env, timeout_s
        key = secrets.token_bytes(16)
        self.listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = self.listener.address
        self.folder = tempfile.TemporaryDirectory(prefix="differential-")
        self.ranks = start_ranks("differential", world, host, str(port), key.hex(), folder=self.folder.name,
                                 env=env)
        self.connections: dict[int, Any] = {}
        accepted = threading.Thread(target=self._accept, daemon=True)
        accepted.start()
        accepted.join(timeout_s)
        if len(self.connections) < world:
            self.stop()
            raise Hang(f"{len(self.connections)} of {world} ranks connected within {timeout_s:.0f} s\n{self.output()}")

    def _accept(self) -> None:
        while len(self.connections) < self.world:
            connection = self.listener.accept()
            _, rank = connection.recv()
            self.connections[rank] = connection

    def ask(self, message: tuple, timeout_s: float | None = None) -> list[tuple[str, Any]]:
        """Send ``message`` to every rank; every rank's answer, in rank order."""
        for rank in range(self.world):
            self.connections[rank].send(message)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        answers = []
        for rank in range(self.world):
            connection = self.connections[rank]
            if not connection.poll(max(0.0, deadline - time.monotonic())):
                self.dump_stacks()
                raise Hang(f"rank {rank} did not answer {message[:2]} within {timeout_s or self.timeout_s:.0f} s"
                           f"\n{self.output()}")
            answers.append(pickle.loads(connection.recv_bytes()))  # (by value: workers/differential.py)
        return answers

    def dump_stacks(self) -> None:
        """Every rank's threads' stacks into its output (a rank that hangs: where)."""
        for rank in self.ranks:
            pid = rank.pid
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)

    def output(self) -> str:
        """What the ranks printed (forked ranks: their files)."""
        parts = []
        for rank in range(self.world):
            path = os.path.join(self.folder.name, str(rank), "stderr")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"-- rank {rank} stderr --\n{f.read()[-12000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for connection in self.connections.values():
            with contextlib.suppress(OSError):
                connection.send(("quit",))
        for rank in self.ranks:
            if not rank.wait(10.0):
                rank.kill()
        for connection in self.connections.values():
            connection.close()
        self.listener.close()
        self.folder.cleanup()


_clusters: dict[str, Cluster] = {}


def cluster(name: str = "gloo", env: dict | None = None, world: int = 2) -> Cluster:
    """The cluster of this name, started on first use (again after a hang killed it)."""
    if name not in _clusters:
        _clusters[name] = Cluster(world, env=env)
    return _clusters[name]


def forget(name: str) -> None:
    """Stop a cluster whose ranks may be stuck (a hang, a failed program): the next use starts anew."""
    stale = _clusters.pop(name, None)
    if stale is not None:
        for rank in stale.ranks:
            rank.kill()
        stale.connections.clear()
        stale.stop()


def stop_all() -> None:
    for name in list(_clusters):
        _clusters.pop(name).stop()


# -- comparing ---------------------------------------------------------------------------------
def differences(reference: Any, replica: Any, where: str = "", tolerance: float = 0.0) -> list[str]:
    """Where ``replica`` differs from ``reference``: tensors bit for bit (NaN equal to NaN), or
    within ``tolerance`` relative to the reference's largest magnitude (at least 1)."""
    if isinstance(reference, torch.Tensor) or isinstance(replica, torch.Tensor):
        if not (isinstance(reference, torch.Tensor) and isinstance(replica, torch.Tensor)):
            return [f"{where}: {_describe(reference)} != {_describe(replica)}"]
        if reference.shape != replica.shape or reference.dtype != replica.dtype:
            return [f"{where}: {reference.dtype}{tuple(reference.shape)} != {replica.dtype}{tuple(replica.shape)}"]
        if torch.equal(reference, replica) or (reference.is_floating_point() and torch.equal(
                reference.isnan(), replica.isnan()) and torch.equal(reference.nan_to_num(), replica.nan_to_num())):
            return []
        scale = max(1.0, reference.double().abs().nan_to_num().max().item()) if reference.numel() else 1.0
        gap = (reference.double() - replica.double()).abs().nan_to_num(float("inf")).max().item()
        if gap <= tolerance * scale:
            return []
        return [f"{where}: differs by {gap:.3g} (the reference's largest magnitude {scale:.3g}; tolerance "
                f"{tolerance:.1g})"]
    if isinstance(reference, dict) and isinstance(replica, dict):
        found = [f"{where}: keys {sorted(map(str, reference))} != {sorted(map(str, replica))}"] \
            if reference.keys() != replica.keys() else []
        for key in reference.keys() & replica.keys():
            found += differences(reference[key], replica[key], f"{where}.{key}", tolerance)
        return found
    if isinstance(reference, list) and isinstance(replica, list):
        if len(reference) != len(replica):
            return [f"{where}: {len(reference)} items != {len(replica)}"]
        return [d for k, (a, b) in enumerate(zip(reference, replica))
                for d in differences(a, b, f"{where}[{k}]", tolerance)]
    if reference != replica and not (isinstance(reference, float) and reference != reference and replica != replica):
        return [f"{where}: {reference!r} != {replica!r}"]
    return []


def _describe(value: Any) -> str:
    return f"tensor{tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


# -- the programs ------------------------------------------------------------------------------
@st.composite
def configs(draw: Any) -> dict:
    """A program's configuration. Sharded architectures refuse communication hooks, and fully
    sharded ``find_unused_parameters`` (a documented GradschedError at the wrap): drawn there a
    quarter of the time, to see the refusal. Sharded compression also rounds the parameters to the
    wire dtype (as documented), which no DDP hook does: not drawn there (tests/distributed/test_sharded.py compares
    it with its own reference); fully sharded refuses it, and is drawn with it to see the refusal."""
    architecture = draw(st.sampled_from(("allreduce", "allreduce", *ARCHITECTURES)))
    sharded = architecture != "allreduce"
    rarely = st.sampled_from((False, False, False, True)) if sharded else st.booleans()
    comm = draw(st.sampled_from(("none", "none", "bf16", "hook")))
    if sharded and (comm == "hook" and not draw(rarely) or comm == "bf16" and architecture == "sharded"):
        comm = "none"
    return {"api": draw(st.sampled_from(("ddp", "wrap"))), "policy": draw(st.sampled_from(POLICIES)),
            "architecture": architecture, "optimizer": draw(st.sampled_from(OPTIMIZERS)),
            "scheduler": draw(st.booleans()),
            "find_unused": draw(rarely if architecture == "fully_sharded" else st.booleans()),
            "float64": draw(st.booleans()),
            "comm": comm, "handoff": draw(st.booleans()), "emulated": draw(st.booleans()),
            "seed": draw(st.integers(0, 3))}


CONFIGS = configs()
SEEDS = st.integers(0, 50)


class Program(RuleBasedStateMachine):
    """One drawn program, run under DDP and gradsched on the ranks of :func:`cluster`."""

    cluster_name = "gloo"  # which cluster (a subclass may run on one started with a planted defect)
    cluster_env: dict | None = None
    world = 2

    def __init__(self) -> None:
        super().__init__()
        self.config: dict = {}
        self.running = False  # begun, and not refused since
        self.saved = False  # a checkpoint was taken
        self.grads = False  # some parameter holds a gradient (torch's clip_grad_value_ raises over none)
        self.long_run = False  # the program ran past the measured trial
        self.averaged = False  # the gradients hold an average (a backward pass that synced, no zero_grad since)
        self.tolerance = 0.0  # exact, until the program leaves DDP's arithmetic (SHARDED_TOLERANCE)
        # torch's DDP with find_unused_parameters fails (a hang, or "Encountered gradient which is
        # undefined, but still allreduced by DDP reducer") where a backward pass that syncs leaves a
        # parameter unused on some rank after what its reducer keeps from an irregular pass: a
        # backward pass under no_sync() followed by gradients set to None; a forward pass with
        # gradients and no backward pass (the reducer keeps what it found unused there for the next
        # backward pass, whatever forward passes run between); a second backward pass over one
        # forward pass. After any of these, until a plain backward pass that syncs, every rank uses
        # every parameter (the bugs are DDP's: such programs have no reference)
        self.irregular = False
        self.stale_forward = False  # a forward pass with gradients that syncs and has no backward pass yet
        self.refusal: str | None = None

    # -- talking to the ranks ------------------------------------------------------------------
    def _ask(self, message: tuple) -> list[dict]:
        ranks = cluster(self.cluster_name, self.cluster_env, self.world)
        try:
            answers = ranks.ask(message)
        except Hang:
            self.running = False
            forget(self.cluster_name)
            raise
        failed = [(rank, body) for rank, (status, body) in enumerate(answers) if status != "ok"]
        if failed:
            self._failed(message, failed, len(answers))
        return [body for _, body in answers]

    def _failed(self, message: tuple, failed: list[tuple[int, dict]], world: int) -> None:
        rank, body = failed[0]
        said = f"rank {rank}, {body['side']}: {body['type']}: {body['message']}\n{body['traceback']}"
        if body["side"] == "reference":
            self._abandon()
            raise AssertionError(f"torch's DDP refused {message[:2]}: the program is not one DDP accepts "
                                 f"(a precondition of tests/distributed/programs.py is missing)\n{said}")
        documented = [name for name, pattern in REFUSALS.items() if re.search(pattern, body["message"])]
        if len(failed) == world and body["gradsched"] and documented and all(
                b["gradsched"] and b["message"] == body["message"] for _, b in failed):
            self.refusal = documented[0]
            STATS[f"refused: {documented[0]}"] += 1
            self._abandon()
            return
        self._abandon()
        raise AssertionError(f"gradsched failed {message[:2]} where DDP did not\n{said}")

    def _abandon(self) -> None:
        """Drop both sides after a failure (the ranks stay up when they can)."""
        self.running = False
        try:
            cluster(self.cluster_name, self.cluster_env, self.world).ask(("drop",), timeout_s=30)
        except Exception:  # noqa: BLE001 - a rank stuck after the failure: start anew
            forget(self.cluster_name)

    def call(self, name: str, **kwargs: Any) -> None:
        """Run one call on both sides of every rank; what each gave must be equal."""
        if not self.running:
            return
        STATS["calls"] += 1
        answers = self._ask(("call", name, kwargs))
        if not self.running:  # refused
            return
        for rank, answer in enumerate(answers):
            found = differences(answer["reference"], answer["replica"], name, self.tolerance)
            if found:
                STATS["differed"] += 1
                raise AssertionError(f"rank {rank}: {name}({kwargs}) differs from DDP:\n" + "\n".join(found[:12]))

    # -- the configuration ---------------------------------------------------------------------
    @initialize(config=CONFIGS)
    def begin(self, config: dict) -> None:
        self.start(config)

    def start(self, config: dict) -> None:
        self.config = config
        self.running = True
        STATS["programs"] += 1
        self._ask(("begin", config))

    def teardown(self) -> None:
        if not self.running:
            return
        answers = self._ask(("end",))
        if not self.running:
            return
        facts = answers[0].get("facts") or {}
        STATS["handed off"] += int(bool(facts.get("handed_off")))
        for rank, answer in enumerate(answers):
            found = differences(answer["reference"], answer["replica"], "final", self.tolerance)
            if found:
                STATS["differed"] += 1
                raise AssertionError(f"rank {rank}: the final state differs from DDP:\n" + "\n".join(found[:12]))
        STATS["compared"] += 1

    def _unused_ok(self) -> bool:
        return self.config.get("find_unused", False)

    def _used(self, use_side: list[bool]) -> list[bool]:
        """Which ranks use the side layer in a forward pass (see ``irregular``)."""
        return use_side if self._unused_ok() and not self.irregular else [True, True]

    def _backward_ran(self, regular: bool = True) -> None:
        """A backward pass ran: ``regular``, one backward pass over a forward pass that synced."""
        self.grads = True
        self.irregular = not regular
        self.stale_forward = False

    def _cleared(self, how: str) -> None:
        if how in CLEARED:
            self.grads = False
        self.averaged = False  # (zeroed: a backward pass adds to exact zeros)

    # -- the calls -----------------------------------------------------------------------------
    @rule(seed=SEEDS, use_side=st.lists(st.booleans(), min_size=2, max_size=2), sync=st.sampled_from(SYNCS),
          losses=st.sampled_from(("one", "one", "sum", "retain")))
    def train(self, seed: int, use_side: list[bool], sync: str, losses: str) -> None:
        """A forward pass and its backward pass (or two, where DDP allows it)."""
        use_side = self._used(use_side)
        if losses == "retain" and sync == "yes" and self.config["architecture"] != "allreduce" and seed % 4:
            losses = "sum"  # (refused there, and the refusal ends the program: drawn a quarter of the time)
        communicates = sync == "yes" or self.stale_forward  # (DDP's reducer: see stale_forward)
        if self.averaged and self.config["architecture"] != "allreduce":
            self.tolerance = SHARDED_TOLERANCE
        self.call("train", seed=seed, use_side=use_side, sync=sync, losses=losses)
        self._backward_ran(regular=sync == "yes" and losses != "retain")
        self.averaged = self.averaged or communicates

    @rule(seeds=st.lists(SEEDS, min_size=1, max_size=4), zero=st.sampled_from(ZEROS))
    def iterations(self, seeds: list[int], zero: str) -> None:
        """The plain loop, a few times: forward, backward, step, clear (the hand-off comes sooner)."""
        for seed in seeds:
            if self.averaged and self.config["architecture"] != "allreduce":
                self.tolerance = SHARDED_TOLERANCE
            self.averaged = False  # each iteration clears what the one before left
            self.call("train", seed=seed, use_side=[True, True], sync="yes", losses="one")
            self._backward_ran()
            self.call("step", closure_seed=None, use_side=[True, True])
            self.call("zero", how=zero)
            self._cleared(zero)

    @precondition(lambda self: self.config.get("handoff") and not self.long_run)
    @rule(seeds=st.lists(SEEDS, min_size=8, max_size=8), zero=st.sampled_from(ZEROS))
    def run_past_the_trial(self, seeds: list[int], zero: str) -> None:
        """Eight iterations: the measured trial decides (for the buckets: fallback_gain 0.99) and,
        but with fifo, hands them to DDP's reducer; the program goes on past it."""
        self.long_run = True
        self.iterations(seeds, zero)

    @rule(seed=SEEDS, grad=st.booleans())
    def evaluate(self, seed: int, grad: bool) -> None:
        self.call("evaluate", seed=seed, grad=grad)
        self.stale_forward = self.stale_forward or grad
        self.irregular = self.irregular or grad

    @rule(train=st.booleans())
    def mode(self, train: bool) -> None:
        self.call("mode", train=train)

    @rule(how=st.sampled_from(ZEROS))
    def zero(self, how: str) -> None:
        self.call("zero", how=how)
        self._cleared(how)

    @rule(closure_seed=st.none() | SEEDS, use_side=st.lists(st.booleans(), min_size=2, max_size=2))
    def step(self, closure_seed: int | None, use_side: list[bool]) -> None:
        if closure_seed is not None:  # the closure: zero_grad(), a forward pass that syncs, backward()
            self._cleared("optimizer")
            use_side = self._used(use_side)
        self.call("step", closure_seed=closure_seed, use_side=use_side)
        if closure_seed is not None:
            self._backward_ran()
            self.averaged = True

    @rule()
    def read_grads(self) -> None:
        self.call("read_grads")

    @rule(seed=SEEDS, same=st.booleans())
    def set_grads(self, seed: int, same: bool = False) -> None:
        self.call("set_grads", seed=seed, same=same)
        self.grads = True
        self.averaged = False

    @rule(how=st.sampled_from(("norm", "value", "wrapper_norm", "wrapper_value")),
          value=st.sampled_from((0.01, 0.1, 1.0)))
    def clip(self, how: str, value: float) -> None:
        if how.endswith("value") and not self.grads:
            how = how.replace("value", "norm")
        if how.endswith("norm") and self.averaged and self.config["architecture"] != "allreduce":
            self.tolerance = SHARDED_TOLERANCE  # the global norm from the shards' norms: summed in another order
        self.call("clip", how=how, value=value)

    @rule(factor=st.sampled_from((0.5, 2.0)))
    def learning_rate(self, factor: float) -> None:
        self.call("learning_rate", factor=factor)

    @precondition(lambda self: self.config.get("scheduler"))
    @rule()
    def schedule(self) -> None:
        self.call("schedule")

    @rule()
    def checkpoint(self) -> None:
        self.call("checkpoint")
        self.saved = True

    @precondition(lambda self: self.saved)
    @rule()
    def restore(self) -> None:
        self.call("restore")

    @rule(ranks=st.lists(st.booleans(), min_size=2, max_size=2))
    def reset_statistics(self, ranks: list[bool]) -> None:
        """Buffers changed between two forward passes, on some ranks (DDP syncs rank 0's)."""
        self.call("reset_statistics", ranks=ranks)

    @rule(seconds=st.lists(st.sampled_from(PAUSES), min_size=2, max_size=2))
    def pause(self, seconds: list[float]) -> None:
        """Time passes on gradsched's side (each rank its own): queued and finished both happen."""
        self.call("pause", seconds=seconds)


SERVER_CONFIGS = CONFIGS.map(lambda c: {**c, "architecture": "ps", "api": "wrap",
                                        "comm": "bf16" if c["comm"] == "bf16" else "none"})
# (parameter servers need gradsched.wrap, and refuse communication hooks: both at the wrap, tested in
# tests/runtime/test_ddp_wrapper.py and tests/distributed/test_architecture_contract.py)


class ServerProgram(Program):
    """A program under ``architecture="ps"``: two workers and a parameter server (a third rank),
    DDP over the two workers the reference."""

    cluster_name = "ps"
    world = 3

    @initialize(config=SERVER_CONFIGS)
    def begin(self, config: dict) -> None:
        self.start(config)
