"""The coordinator: what happens on the training thread of one rank.

* a post-accumulate-grad hook per parameter hands each gradient to the exchange;
* a forward pre-hook per module that owns parameters waits for those parameters' reduction
  and applies every pending update (the Dependency Proxy: a layer waits only for itself);
* the root module's forward pre-hook closes the previous round, broadcasts buffers and
  waits for parameters used outside the module that owns them;
* ``step`` / ``zero_grad`` / ``synchronize`` of the returned optimizer come here.

A *round* is one backward pass that communicates. Plans change only at control points,
fixed rounds at which every rank takes part in one broadcast from rank 0.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..core.base import PolicyConfig
from ..core.policies import FifoConfig
from ..core.task import TensorSpec
from ..sim import Cluster, simulate
from ..sim.plan import default_ready_times, make_plan
from .config import RuntimeConfig
from .exchange import Exchange, GradschedError
from .profiling import RoundTiming, measured_table
from .tracing import RunTrace

Snapshot = list[dict[str, Any]]  # hyper-parameters of every group at step() time


class Coordinator:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Sequence[str],
        params: Sequence[nn.Parameter],
        policy: PolicyConfig,
        config: RuntimeConfig,
        groups: dict[str, dist.ProcessGroup],
        rank: int,
        world_size: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.names = list(names)
        self.params = list(params)
        self.policy = policy
        self.config = config
        self.groups = groups
        self.rank = rank
        self.world_size = world_size
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self._cuda = any(p.is_cuda for p in self.params)
        self.tensors = [
            TensorSpec(name, p.numel(), layer=i, priority=i, element_size=p.element_size())
            for i, (name, p) in enumerate(zip(self.names, self.params))
        ]
        self.trace = RunTrace(rank) if config.trace else None
        plan = make_plan(self.tensors, default_ready_times(self.tensors), policy)
        self.exchange = Exchange(
            self.tensors, self.params, plan, groups["data"], world_size, config.timeout_s,
            self.trace.on_exchange if self.trace else None,
        )
        self.round = 0
        self._round_open = False  # a backward pass handed gradients over and was not closed yet
        self._new_round = True  # the next gradient starts a new round
        self._no_sync = 0
        self._pending_update: dict[int, Snapshot] = {}  # parameter -> hyper-parameters to update with
        self._pending_zero: dict[int, bool] = {}  # parameter -> set_to_none, once updated
        self._timing = RoundTiming()  # of the latest forward pass and the backward pass after it
        self._timings: list[RoundTiming] = []  # of the latest closed rounds
        self.prediction: dict[str, Any] | None = None  # the latest simulated comparison with fifo
        self._globally_unused: set[int] = set()
        self._controlled: set[int] = set()
        self._ran: set[int] = set()  # modules whose forward ran since the root's
        self._owners: dict[int, list[nn.Module]] = {}
        self._orphans: list[int] = []  # parameters used outside the modules that own them
        self._handles: list[Any] = []
        self._tracing_module: tuple[str, float] | None = None
        self._closed = False
        self._broken = False
        self._attach()

    @property
    def policy_name(self) -> str:
        return self.policy.name

    # -- hooks ----------------------------------------------------------------------------
    def _attach(self) -> None:
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        module_params: dict[nn.Module, list[int]] = {}
        for module in self.model.modules():
            idx = [self.index[id(p)] for p in module.parameters(recurse=False) if id(p) in self.index]
            if idx:
                module_params[module] = idx
                for i in idx:
                    self._owners.setdefault(i, []).append(module)
        self._module_params = module_params
        module_names = {m: n for n, m in self.model.named_modules()}
        self._module_name = {m: module_names[m] for m in module_params}
        self._owner_names = {module_names[m]: [self.names[i] for i in idx] for m, idx in module_params.items()}
        self._handles.append(self.model.register_forward_pre_hook(self._before_root))
        self._handles.append(self.model.register_forward_hook(self._after_root))
        for module in module_params:
            self._handles.append(module.register_forward_pre_hook(self._before_module))
        self._handles.append(self.model.register_state_dict_pre_hook(lambda *a, **k: self.synchronize()))
        self._handles.append(self.model.register_load_state_dict_pre_hook(lambda *a, **k: self.synchronize()))

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._no_sync or self._closed:
            return
        now = time.perf_counter()
        if self._new_round:
            self._start_round(now)
        i = self.index[id(p)]
        if self.exchange.ready_round[i] == self.round:
            raise GradschedError(
                f"parameter {self.names[i]!r} received a gradient twice in one backward pass; run one "
                "backward per forward, and use optimizer.no_sync() for backward passes that should not communicate"
            )
        home = self._homes.get(i)
        if home is not None:
            if p.grad is not home:  # a fresh gradient (after zero_grad(set_to_none=True)): move it in
                home.copy_(p.grad)
                p.grad = home
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        self._timing.ready[self.names[i]] = now
        if self.trace:
            self.trace.ready(self.round, self.names[i], now, backward_from=self._timing.forward_end)
        self.exchange.mark_ready(i, p.grad, self.round)

    def _start_round(self, now: float) -> None:
        self.round += 1
        self._new_round = False
        self._round_open = True
        self._homes = self.exchange.homes(self.round)

    def _before_root(self, module: nn.Module, args: Any) -> None:
        if self._closed:
            return
        self._close_round()
        if not self.exchange.plan_for(self.round + 1).cross_barrier:
            self.synchronize()
        elif self._orphans:
            self._wait_and_apply(self._orphans, "parameters used outside their modules")
        if self.config.broadcast_buffers and self.world_size > 1:
            self._broadcast_buffers()
        self._ran.clear()
        self._new_round = True
        self._timing = RoundTiming(forward_start=time.perf_counter())

    def _after_root(self, module: nn.Module, args: Any, output: Any) -> None:
        self._timing.forward_end = time.perf_counter()
        if self.trace:
            self._trace_forward(self._timing.forward_end)

    def _trace_forward(self, now: float) -> None:
        """Close the forward span of the module that ran last."""
        if self._tracing_module is not None:
            name, start = self._tracing_module
            self.trace.span("forward", name, start, now)
            self._tracing_module = None

    def _before_module(self, module: nn.Module, args: Any) -> None:
        if self._closed:
            return
        self._ran.add(id(module))
        name = self._module_name[module]
        first = name not in self._timing.module_starts
        entered = time.perf_counter()
        if first:
            self._timing.module_starts[name] = entered
        idx = self._module_params[module]
        if any(i in self._pending_update or i in self._pending_zero for i in idx):
            self._wait_and_apply(idx, f"module {name}")
            if first:
                self._timing.module_waits[name] = time.perf_counter() - entered
        if self.trace:
            now = time.perf_counter()
            self._trace_forward(entered)
            self._tracing_module = (name or type(module).__name__, now)

    # -- rounds ---------------------------------------------------------------------------
    def _close_round(self) -> None:
        """The backward pass of the open round is over: every trainable parameter must have
        handed over a gradient (or be marked unused) so the plan can complete."""
        if not self._round_open:
            return
        self._round_open = False
        self._timings = (self._timings + [self._timing])[-(self.config.profile_rounds + 1) :]
        missing = [i for i in range(len(self.params)) if self.exchange.ready_round[i] != self.round]
        if missing and not self.config.find_unused_parameters:
            names = [self.names[i] for i in missing[:5]]
            self._broken = True  # this round can never complete: close() must not wait for it
            raise GradschedError(
                f"{len(missing)} parameters got no gradient in this backward pass, e.g. {names}; if some "
                "parameters are legitimately unused, pass find_unused_parameters=True to gradsched.wrap"
            )
        if self.config.find_unused_parameters:
            # Unused here: contribute zeros. Unused everywhere: the gradient stays None and
            # the parameter is not updated, as if it were not trainable this round.
            flags = torch.zeros(len(self.params), dtype=torch.float64)
            flags[missing] = 1.0
            if self.world_size > 1:
                with _failing_rank("agreeing on unused parameters"):
                    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.groups["control"])
            self._globally_unused = {i for i in missing if flags[i].item() == 1.0}
            for i in missing:
                p = self.params[i]
                self._flush(i)
                home = self._homes.get(i)
                zeros = home.zero_() if home is not None else torch.zeros_like(p)
                if i not in self._globally_unused:
                    p.grad = zeros
                self.exchange.mark_ready(i, zeros, self.round)
        self._detect_orphans()

    def _detect_orphans(self) -> None:
        if self._ran:
            ready = [i for i in range(len(self.params)) if self.exchange.ready_round[i] == self.round]
            found = {i for i in ready if not any(id(m) in self._ran for m in self._owners.get(i, []))}
            self._orphans = sorted(set(self._orphans) | found)

    # -- optimizer entry points -----------------------------------------------------------
    def step(self) -> None:
        self._close_round()
        snapshot = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        if not self.exchange.plan_for(self.round).cross_barrier:
            self.synchronize()
            self._apply_now(range(len(self.params)), snapshot)
        else:
            now_ready = []
            for i, p in enumerate(self.params):
                if p.grad is None or i in self._globally_unused:
                    continue
                self._pending_update[i] = snapshot
                if not self.exchange.in_flight(i):
                    now_ready.append(i)
            self._apply(now_ready)
        self._control_point()

    def zero_grad(self, set_to_none: bool) -> None:
        for i, p in enumerate(self.params):
            if self.exchange.in_flight(i) or i in self._pending_update:
                self._pending_zero[i] = set_to_none
            else:
                _clear(p, set_to_none)
        # parameters the optimizer knows but gradsched does not communicate (frozen ones)
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in self.index:
                    _clear(p, set_to_none)

    def synchronize(self) -> None:
        if self._closed:
            return
        self._close_round()
        self._wait_and_apply(range(len(self.params)), "all parameters")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

    # -- applying updates -----------------------------------------------------------------
    def _wait_and_apply(self, indices: Sequence[int], what: str) -> None:
        started = time.perf_counter()
        self.exchange.wait_reduced(list(indices), what)
        if self._cuda:  # the CPU has seen the reductions; the GPU must see them before the update
            self.exchange.order_after_reduction(range(len(self.params)))
        if self.trace:
            self.trace.span("wait", what, started, time.perf_counter())
        reduced = [i for i in list(self._pending_update) + list(self._pending_zero) if not self.exchange.in_flight(i)]
        self._apply(sorted(set(reduced)))

    def _flush(self, i: int) -> None:
        if i in self._pending_update or i in self._pending_zero:
            self._wait_and_apply([i], f"parameter {self.names[i]!r}")

    def _apply(self, indices: Sequence[int]) -> None:
        """Apply pending updates (each with its own snapshot), then pending zeroing."""
        by_snapshot: dict[int, tuple[Snapshot, list[int]]] = {}
        for i in indices:
            snapshot = self._pending_update.pop(i, None)
            if snapshot is not None:
                by_snapshot.setdefault(id(snapshot), (snapshot, []))[1].append(i)
        for snapshot, members in by_snapshot.values():
            self._apply_now(members, snapshot)
        for i in indices:
            set_to_none = self._pending_zero.pop(i, None)
            if set_to_none is not None:
                _clear(self.params[i], set_to_none)

    def _apply_now(self, indices: Sequence[int], snapshot: Snapshot) -> None:
        chosen = {id(self.params[i]) for i in indices}
        if not chosen:
            return
        started = time.perf_counter()
        saved = []
        for group, values in zip(self.optimizer.param_groups, snapshot):
            saved.append((group["params"], {k: group[k] for k in values}))
            group["params"] = [p for p in group["params"] if id(p) in chosen]
            group.update(values)
        try:
            self.optimizer.step()
        finally:
            for group, (params, values) in zip(self.optimizer.param_groups, saved):
                group["params"] = params
                group.update(values)
        if self.trace:
            self.trace.span("update", f"{len(chosen)} parameters", started, time.perf_counter())

    # -- plans ------------------------------------------------------------------------------
    def _control_point(self) -> None:
        """At fixed rounds, rank 0 proposes a plan from its measurements and every rank
        adopts it from the next round on: the same collective on every rank, same place."""
        r = self.round
        first = self.config.profile_rounds + 1
        due = r == first or (self.config.replan_every and r > first and (r - first) % self.config.replan_every == 0)
        if not due or r in self._controlled:
            return
        self._controlled.add(r)
        proposal = [self._propose_plan() if self.rank == 0 else None]
        if self.world_size > 1:
            with _failing_rank("agreeing on a new plan"):
                dist.broadcast_object_list(proposal, src=0, group=self.groups["control"])
        if proposal[0] is None:
            return
        plan, self.prediction = proposal[0]
        if plan is not None:
            self.exchange.set_plan(plan, r + 1)

    def _propose_plan(self) -> tuple[Any, dict[str, Any] | None] | None:
        """Rank 0: a plan from the latest measured rounds (the first round warms up), and
        whether the policy is predicted to beat DDP-style buckets on this model and link."""
        timings = [t for t in self._timings[1:] if len(t.ready) == len(self.names)][-self.config.profile_rounds :]
        if not timings:
            return None
        ready = {}
        for name in self.names:
            offsets = sorted(t.ready[name] - min(t.ready.values()) for t in timings)
            ready[name] = offsets[len(offsets) // 2]
        est = self.exchange.estimator
        measured = est.ready and est.seconds_per_byte > 0
        link = (est.latency, est.seconds_per_byte, est.per_message) if measured else ()
        policy, prediction = self.policy, None
        if self.config.fallback and policy.name != "fifo" and self.world_size > 1 and measured:
            prediction = self._predict(timings, est.latency, est.seconds_per_byte, est.per_message)
            if prediction and prediction["use_fifo"]:
                policy = FifoConfig()
        plan = make_plan(self.tensors, ready, policy, *link)
        current = self.exchange.plan_for(self.round + 1)
        if plan.messages == current.messages and plan.cross_barrier == current.cross_barrier:
            return None, prediction
        return plan, prediction

    def _predict(
        self, timings: list[RoundTiming], latency: float, per_byte: float, overhead: float
    ) -> dict[str, Any] | None:
        """Simulate the measured model under the policy and under fifo on the measured link."""
        sizes = {name: (p.numel(), p.element_size()) for name, p in zip(self.names, self.params)}
        table = measured_table(timings, self._owner_names, sizes)
        if table is None:
            return None
        n = self.world_size
        cluster = Cluster(n, bandwidth_bps=8.0 * 2 * (n - 1) / n / per_byte, latency_s=latency, overhead_s=overhead)
        rounds = self.policy.build().warmup_iterations + 4
        ours = simulate(table, cluster, self.policy, iterations=rounds, record=False).iteration_s
        fifo = simulate(table, cluster, FifoConfig(), iterations=6, record=False).iteration_s
        return {"policy_s": ours, "fifo_s": fifo, "compute_s": table.compute_s, "comm_s": table.gradient_bytes * per_byte,
                "latency_s": latency, "overhead_s": overhead, "use_fifo": ours > fifo * (1.0 - self.config.fallback_gain)}

    # -- reporting and teardown ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        plan = self.exchange.plan_for(self.round + 1)
        est = self.exchange.estimator
        return {
            "policy": self.policy.name,
            "rounds": self.round,
            "plan_messages": len(plan.messages),
            "plans_adopted": self.exchange.plans_adopted,
            "link_latency_s": est.latency,
            "link_bytes_per_s": est.bytes_per_second,
            "plan_policy": plan.policy,
            "prediction": self.prediction,
        }

    def _broadcast_buffers(self) -> None:
        buffers = [b for b in self.model.buffers() if b is not None]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        for dtype in sorted(by_dtype, key=str):
            group = by_dtype[dtype]
            flat = torch.cat([b.detach().reshape(-1) for b in group])
            with _failing_rank("broadcasting buffers"):
                dist.broadcast(flat, src=0, group=self.groups["buffers"])
            offset = 0
            with torch.no_grad():
                for b in group:
                    b.copy_(flat[offset : offset + b.numel()].view_as(b))
                    offset += b.numel()

    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self._broken and self.exchange.error is None:
                self.synchronize()
        finally:
            self._closed = True
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self.exchange.close()
            if self.trace:
                self.trace.save(self.config.trace)


@contextmanager
def _failing_rank(what: str) -> Iterator[None]:
    try:
        yield
    except GradschedError:
        raise
    except RuntimeError as exc:  # gloo/NCCL report a dead or stuck peer as RuntimeError
        raise GradschedError(f"{what} failed: another rank died or is unreachable ({exc})") from exc


def _clear(p: torch.Tensor, set_to_none: bool) -> None:
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()
