"""Hugging Face Accelerate with gradsched in DDP's place.

Accelerate wraps the model in PyTorch's DDP inside ``accelerator.prepare`` and offers no
seam to change the wrapper, so this module gives one call to use instead::

    from gradsched.integrations.accelerate import prepare

    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, loader, scheduler,
                                                  policy="prophet")

It is ``accelerator.prepare`` with the model prepared as Accelerate prepares it (device,
mixed-precision forward) but wrapped by :class:`gradsched.DistributedDataParallel` instead of
DDP. :class:`GradschedAccelerator` does the same for every model an ``Accelerator`` prepares
(``GradschedAccelerator(policy="prophet", ...)`` in place of ``Accelerator(...)``); the Hugging
Face ``Trainer`` uses it (:mod:`gradsched.integrations.transformers`). The rest of an Accelerate loop works unchanged: ``accelerator.accumulate(model)`` uses
the wrapper's ``no_sync()``, ``accelerator.backward``, ``accelerator.clip_grad_norm_`` (torch's
clipping, which waits for gradients still on the wire), the prepared optimizer and scheduler,
and ``accelerator.save_state``/``load_state``, which see the model without the wrapper, as
with DDP, so checkpoints move between a DDP run and a gradsched run; ``accelerator.unwrap_model``
unwraps it as it unwraps DDP (gradsched's wrapper is a ``DistributedDataParallel``). A
communication hook asked for with ``DistributedDataParallelKwargs(comm_hook=..., comm_wrapper=...,
comm_state_option=...)`` is registered as Accelerate registers it on DDP, and runs on the
policy's messages. Installed by ``pip install gradsched[accelerate]``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..extras import require

require("accelerate", "accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

from gradsched.runtime.frontend.ddp import DistributedDataParallel  # noqa: E402


def prepare(accelerator: Accelerator, *objects: Any, policy: str | None = None,
            policy_options: dict[str, Any] | None = None, **options: Any) -> Any:
    """``accelerator.prepare(*objects)``, the one model among them wrapped by gradsched
    (``policy``, ``policy_options`` and ``options`` as :class:`gradsched.DistributedDataParallel`
    takes them; DDP keywords from the accelerator's ``DistributedDataParallelKwargs`` too)."""
    models = [o for o in objects if isinstance(o, nn.Module)]
    if len(models) != 1:
        raise ValueError(f"gradsched prepare: pass exactly one model, got {len(models)}")
    if accelerator.distributed_type not in DISTRIBUTED:
        raise ValueError(f"gradsched prepare: Accelerate's distributed type is {accelerator.distributed_type}; "
                         "gradsched replaces DDP only (launch with several processes, on CPU or GPU)")
    prepared = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            inner = accelerator.prepare_model(obj, evaluation_mode=True)  # device, autocast; no DDP
            obj = wrap_prepared(accelerator, inner, dict(options, policy=policy, policy_options=policy_options))
        else:
            obj = accelerator.prepare(obj)
        prepared.append(obj)
    return prepared[0] if len(prepared) == 1 else tuple(prepared)


DISTRIBUTED = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def wrap_prepared(accelerator: Accelerator, inner: nn.Module, options: dict[str, Any]) -> DistributedDataParallel:
    """``inner`` (prepared by Accelerate for evaluation: device, autocast, compile) wrapped by
    gradsched where Accelerate would wrap it by DDP, with the accelerator's DDP keywords and its
    communication hook."""
    ddp_options = accelerator.ddp_handler.to_kwargs() if accelerator.ddp_handler is not None else {}
    device = next(inner.parameters()).device
    wrapped = DistributedDataParallel(inner, device_ids=None if device.type == "cpu" else [device],
                                      **ddp_options, **options)
    if accelerator.ddp_handler is not None:  # comm_hook=, comm_wrapper=: as Accelerate registers them
        accelerator.ddp_handler.register_comm_hook(wrapped)
    wrapped._is_accelerate_prepared = True
    return wrapped


class GradschedAccelerator(Accelerator):
    """Accelerate's ``Accelerator``, with the models it prepares for training wrapped by
    :class:`gradsched.DistributedDataParallel` where it would wrap them by DDP (several processes,
    on CPU or GPU); everything else is Accelerate's::

        accelerator = GradschedAccelerator(policy="prophet", gradient_accumulation_steps=2)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    ``policy``, ``policy_options`` and ``gradsched`` (other gradsched options, a dict) are
    gradsched's; every other argument is the ``Accelerator``'s."""

    def __init__(self, *args: Any, policy: str | None = None, policy_options: dict[str, Any] | None = None,
                 gradsched: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gradsched_options = dict(gradsched or {}, policy=policy, policy_options=policy_options)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> nn.Module:
        if (evaluation_mode or self.distributed_type not in DISTRIBUTED or getattr(model, "_is_accelerate_prepared",
                                                                                  False)
                or not any(p.requires_grad for p in model.parameters())):
            return super().prepare_model(model, device_placement, evaluation_mode)
        inner = super().prepare_model(model, device_placement, evaluation_mode=True)
        return wrap_prepared(self, inner, self.gradsched_options)
