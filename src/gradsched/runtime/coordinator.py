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
from ..core.task import TensorSpec
from ..sim.plan import default_ready_times, make_plan
from .config import RuntimeConfig
from .errors import GradschedError, failing_rank
from .exchange import Exchange
from .planning import Planner
from .profiling import RoundTiming
from .tracing import RunTrace
from .updates import DeferredUpdates, clear_grad


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
        self.updates = DeferredUpdates(optimizer, self.params, self.names, self.exchange, self.trace)
        self._timing = RoundTiming()  # of the latest forward pass and the backward pass after it
        self._globally_unused: set[int] = set()
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
        owners = {module_names[m]: [self.names[i] for i in idx] for m, idx in module_params.items()}
        self.planner = Planner(self.tensors, self.params, self.policy, self.config, owners, self.exchange,
                               self.groups["control"], self.rank, self.world_size)
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
            self.updates.wait_and_apply(self._orphans, "parameters used outside their modules")
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
        if any(self.updates.pending(i) for i in idx):
            self.updates.wait_and_apply(idx, f"module {name}")
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
        self.planner.record(self._timing)
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
                with failing_rank("agreeing on unused parameters"):
                    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.groups["control"])
            self._globally_unused = {i for i in missing if flags[i].item() == 1.0}
            for i in missing:
                p = self.params[i]
                self.updates.flush(i)
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
        snapshot = self.updates.snapshot()
        if not self.exchange.plan_for(self.round).cross_barrier:  # like DDP: wait, then update all
            self.synchronize()
            self.updates.apply_now(range(len(self.params)), snapshot)
        else:
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None and i not in self._globally_unused]
            self.updates.request_step(with_grad, snapshot)
        self.planner.control_point(self.round)

    def zero_grad(self, set_to_none: bool) -> None:
        self.updates.request_zero(set_to_none)
        # parameters the optimizer knows but gradsched does not communicate (frozen ones)
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in self.index:
                    clear_grad(p, set_to_none)

    def synchronize(self) -> None:
        if self._closed:
            return
        self._close_round()
        self.updates.wait_and_apply(range(len(self.params)), "all parameters")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

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
            "prediction": self.planner.prediction,
        }

    def _broadcast_buffers(self) -> None:
        buffers = [b for b in self.model.buffers() if b is not None]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        for dtype in sorted(by_dtype, key=str):
            group = by_dtype[dtype]
            flat = torch.cat([b.detach().reshape(-1) for b in group])
            with failing_rank("broadcasting buffers"):
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
