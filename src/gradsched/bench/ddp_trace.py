"""A trace of DDP's own iterations in the bench, in the format of gradsched's run traces
(:mod:`gradsched.runtime.diagnostics.tracing`): its forward passes, when each gradient was accumulated,
and each bucket's all-reduce from launch to result (a communication hook that times
PyTorch's own all-reduce hook). Timelines of DDP and of a policy can then be drawn on one
axis (:func:`gradsched.plot.plot_iteration_timelines`)."""

from __future__ import annotations

import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from gradsched.runtime.diagnostics.tracing import RunTrace


class DdpTracer:
    """Attach to a DDP model before training; ``save`` writes rank ``rank``'s trace."""

    def __init__(self, ddp: DDP, rank: int) -> None:
        self.trace = RunTrace(rank)
        self.round = 0
        self._forward_start = self._forward_end = 0.0
        module = ddp.module
        self._names = {id(p): name for name, p in module.named_parameters()}
        module.register_forward_pre_hook(self._before_forward)
        module.register_forward_hook(self._after_forward)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._accumulated)
        ddp.register_comm_hook(None, self._all_reduce)

    def _before_forward(self, module, args) -> None:
        self.round += 1
        self._forward_start = time.perf_counter()

    def _after_forward(self, module, args, output) -> None:
        self._forward_end = time.perf_counter()
        self.trace.span("forward", "forward", self._forward_start, self._forward_end)

    def _accumulated(self, p: torch.Tensor) -> None:
        self.trace.ready(self.round, self._names[id(p)], time.perf_counter(), self._forward_end)

    def _all_reduce(self, state, bucket):  # unannotated: DDP checks a hook's annotations, here strings
        round_index, k, buffer = self.round, bucket.index(), bucket.buffer()
        names = [self._names[id(p)] for p in bucket.parameters()]
        nbytes = buffer.numel() * buffer.element_size()
        self.trace.on_exchange("launch", round_index, k, nbytes, time.perf_counter(), names)

        def done(future: torch.futures.Future) -> torch.Tensor:
            self.trace.on_exchange("done", round_index, k, nbytes, time.perf_counter())
            return future.value()

        return default_hooks.allreduce_hook(state, bucket).then(done)

    def save(self, path: str) -> str:
        return self.trace.save(path)
