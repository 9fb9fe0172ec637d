"""DDP communication hooks on gradsched's messages.

``model.register_comm_hook(state, hook)`` runs a DDP communication hook (PyTorch's
``allreduce_hook``, ``fp16_compress_hook``, ``bf16_compress_hook``, their wrappers, PowerSGD, or a
user's own) on every message the policy plans, in the plan's order and partition: each message
buffer (one per dtype) is handed to the hook as a bucket with ``GradBucket``'s methods, and the
Future the hook returns completes the message (its value is copied into the buffer where it is
another tensor, as DDP copies it). The hook divides, as under DDP.

* **Bucket indices** are stable: a message keeps its index across re-plans for as long as its
  contents (the same slices of the same gradients) stay; a message with new contents gets a
  new index, so a stateful hook keyed by index (PowerSGD's error feedback and warm start) starts
  that message's state afresh, which the ``gradsched`` logger says at INFO. ``is_last()`` is the
  round's last buffer, so per-iteration counters (PowerSGD's ``start_powerSGD_iter``) count
  iterations.
* **gradients()** are views of the buffer: a whole gradient with its parameter's shape, a slice
  of whole rows with its rows' shape, any other slice flat (PowerSGD then sends it uncompressed).
* **Groups.** A hook communicates on the group its state names. Where that is the default group,
  ``None``, or the wrapper's ``process_group`` (as for PyTorch's hooks and ``PowerSGDState``), the
  hook is given gradsched's own data group instead (the state's ``process_group`` attribute is
  set to it), so the hook's collectives are issued in gradsched's order by gradsched's one
  communication thread and never meet the training loop's own collectives on the default group.
* **Order.** PyTorch's plain hooks issue their one collective inside the call, so messages
  pipeline as without a hook. Any other hook may issue collectives later, in callbacks of its
  futures (PowerSGD does) on the backend's threads, where two messages' collectives could be
  issued in a different order on different ranks: those run one message at a time (the
  launcher waits for each hook's Future before the next message). A user's hook that issues
  all its collectives inside the call says so with :func:`pipelined`, and pipelines too.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradsched.core.plan import Plan
from gradsched.runtime.errors import GradschedError
from gradsched.runtime.torch_private import is_future
from gradsched.runtime.comm.plans import Adopted, PlanVersions
from gradsched.runtime.comm.transport import BaseTransport, MessageKey, Reduced

logger = logging.getLogger("gradsched")

_SYNCHRONOUS = (default_hooks.allreduce_hook, default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook)
_WIRE = {default_hooks.fp16_compress_hook: torch.float16, default_hooks.bf16_compress_hook: torch.bfloat16}
_WRAPPERS = {"fp16_compress_wrapper_hook": torch.float16, "bf16_compress_wrapper_hook": torch.bfloat16}


def _wrapped(hook: Callable) -> Callable | None:
    """The hook inside one of PyTorch's compress wrappers, or None."""
    if getattr(hook, "__name__", None) not in _WRAPPERS or not hook.__closure__:
        return None
    inner = [c.cell_contents for c in hook.__closure__ if callable(c.cell_contents)]
    return inner[0] if len(inner) == 1 else None


PIPELINED = "_gradsched_pipelined"  # the attribute pipelined() sets


def pipelined(hook: Callable) -> Callable:
    """Mark a communication hook as issuing all its collectives inside the call (none in its
    futures' callbacks), so gradsched lets its messages pipeline as PyTorch's plain hooks do:
    ``model.register_comm_hook(state, gradsched.pipelined(my_hook))``. Returns ``hook``."""
    setattr(hook, PIPELINED, True)
    return hook


def synchronous(hook: Callable) -> bool:
    """Whether ``hook`` issues all its communication inside the call (PyTorch's plain hooks and
    their compress wrappers, or a hook marked :func:`pipelined`): its messages may pipeline."""
    inner = _wrapped(hook)
    return (hook in _SYNCHRONOUS or getattr(hook, PIPELINED, False)
            or (inner is not None and synchronous(inner)))


def wire_dtype_of(hook: Callable) -> torch.dtype | None:
    """The dtype ``hook`` sends gradients in, where it is known (PyTorch's fp16/bf16 hooks and
    wrappers of the plain all-reduce): the plans then count those bytes."""
    if hook in _WIRE:
        return _WIRE[hook]
    inner = _wrapped(hook)
    if inner is default_hooks.allreduce_hook:
        return _WRAPPERS[hook.__name__]
    return None


def hook_state(state: Any, group: dist.ProcessGroup, users_group: dist.ProcessGroup | None) -> Any:
    """The state to call the hook with: gradsched's ``group`` where the user's state names the
    default group, None or ``users_group`` (see the module's docstring)."""
    ours = (None, dist.group.WORLD, users_group)
    if state is None or isinstance(state, dist.ProcessGroup):
        return group if any(state is g for g in ours) else state
    if hasattr(state, "process_group") and any(state.process_group is g for g in ours):
        state.process_group = group
    return state


class MessageBucket:
    """One buffer of one message, as a DDP hook sees a bucket (``dist.GradBucket``'s methods)."""

    def __init__(self, index: int, last: bool, buffer: torch.Tensor, pieces: Sequence[tuple[torch.Tensor, int, int]]):
        self._index = index
        self._last = last
        self._buffer = buffer
        self._pieces = list(pieces)  # (parameter, first element, number of elements), in the buffer's order

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def parameters(self) -> list[torch.Tensor]:
        return [p for p, _, _ in self._pieces]

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for p, first, numel in self._pieces:
            flat = self._buffer[offset : offset + numel]
            offset += numel
            row = p[0].numel() if p.dim() > 1 else 0
            if numel == p.numel():
                views.append(flat.view(p.shape))
            elif row and first % row == 0 and numel % row == 0:
                views.append(flat.view(numel // row, *p.shape[1:]))
            else:
                views.append(flat)
        return views


def _result(buffer: torch.Tensor, future: torch.futures.Future) -> torch.Tensor:
    """The hook's result into the message's buffer (where it is another tensor)."""
    value = future.value()
    if isinstance(value, (list, tuple)):
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise GradschedError(f"the communication hook's Future completed with {type(value).__name__}, "
                             "not a tensor of the bucket's size (DDP's contract: Future[torch.Tensor])")
    if value is not buffer:
        if value.numel() != buffer.numel():
            raise GradschedError(f"the communication hook returned {value.numel()} elements for a bucket of "
                                 f"{buffer.numel()}")
        buffer.copy_(value.view(-1))
    return buffer


class HookTransport(BaseTransport):
    """Every message through ``hook(state, bucket)`` (see the module's docstring)."""

    def __init__(self, hook: Callable, state: Any, versions: PlanVersions, params: dict[str, torch.Tensor],
                 rank: int) -> None:
        self.hook = hook
        self.state = state
        self.params = params  # name -> parameter
        self.serial = not synchronous(hook)
        self.rank = rank
        self._plans: dict[int, Plan] = {}  # version -> plan
        self._indices: dict[tuple, int] = {}  # (dtype, slices) -> bucket index
        self._announced = 0  # the latest version whose new indices were said
        versions.subscribe(self._adopted)  # the caller holds the exchange's lock

    def _adopted(self, adopted: Adopted) -> None:
        self._plans[adopted.version] = adopted.plan
        for old in [v for v in self._plans if v < adopted.version - 4]:
            del self._plans[old]

    def divide(self, buffers: Sequence[torch.Tensor]) -> None:
        """Nothing: the hook divides, as under DDP."""

    def send(self, key: MessageKey, buffers: Sequence[torch.Tensor],
             on_sent: Callable[[], None] | None = None) -> Reduced:
        plan = self._plans[key.version]
        message = plan.messages[key.index]
        last_message = key.index == len(plan.messages) - 1
        pieces_by_dtype: dict[torch.dtype, list] = {}
        for name, first, numel in message.slices:
            p = self.params[name]
            pieces_by_dtype.setdefault(p.dtype, []).append((p, first, numel))
        dtypes = sorted(pieces_by_dtype, key=str)  # the launcher's buffer order
        futures = []
        fresh = 0
        for j, (dtype, buffer) in enumerate(zip(dtypes, buffers)):
            signature = (str(dtype), tuple((name, first, numel) for name, first, numel in message.slices
                                           if self.params[name].dtype == dtype))
            if signature not in self._indices:
                self._indices[signature] = len(self._indices)
                fresh += key.version > 1
            bucket = MessageBucket(self._indices[signature], last_message and j == len(dtypes) - 1, buffer,
                                   pieces_by_dtype[dtype])
            future = self.hook(self.state, bucket)
            if not is_future(future):
                raise GradschedError(f"the communication hook returned {type(future).__name__}, not a "
                                     "torch.futures.Future (DDP's contract)")
            future = future.then(partial(_result, buffer))
            if self.serial:  # its callbacks may communicate: finished before the next message is issued
                future.wait()
            futures.append(future)
        if fresh and key.version > self._announced and self.rank == 0:
            self._announced = key.version
            logger.info("gradsched: communication hook: the plan from backward pass %d on has new messages; each "
                        "gets a new bucket index, so a hook's state kept per bucket (PowerSGD's error feedback) "
                        "starts afresh for them", key.round)
        return futures

    def close(self, wait: bool) -> None:
        self.state = None
