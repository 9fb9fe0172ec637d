"""Hugging Face Accelerate with gradsched in DDP's place.

Accelerate wraps the model in PyTorch's DDP inside ``accelerator.prepare`` and offers no
seam to change the wrapper, so this module gives one call to use instead::

    from gradsched.integrations.accelerate import prepare

    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, loader, scheduler,
                                                  policy="prophet")

It is ``accelerator.prepare`` with the model prepared as Accelerate prepares it (device,
mixed-precision forward) but wrapped by :class:`gradsched.DistributedDataParallel` instead of
DDP. The rest of an Accelerate loop works unchanged: ``accelerator.accumulate(model)`` uses
the wrapper's ``no_sync()``, ``accelerator.backward``, ``accelerator.clip_grad_norm_`` (torch's
clipping, which waits for gradients still on the wire), the prepared optimizer and scheduler,
and ``accelerator.save_state``/``load_state``, which see the model without the wrapper, as
with DDP, so checkpoints move between a DDP run and a gradsched run. ``accelerator.unwrap_model``
does not know gradsched's wrapper: use ``model.module`` for the model itself (to call
``save_pretrained``, say). Installed by ``pip install gradsched[accelerate]``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..extras import require

require("accelerate", "accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

from ..runtime.ddp import DistributedDataParallel  # noqa: E402


def prepare(accelerator: Accelerator, *objects: Any, policy: str | None = None,
            policy_options: dict[str, Any] | None = None, **options: Any) -> Any:
    """``accelerator.prepare(*objects)``, the one model among them wrapped by gradsched
    (``policy``, ``policy_options`` and ``options`` as :class:`gradsched.DistributedDataParallel`
    takes them; DDP keywords from the accelerator's ``DistributedDataParallelKwargs`` too)."""
    models = [o for o in objects if isinstance(o, nn.Module)]
    if len(models) != 1:
        raise ValueError(f"gradsched prepare: pass exactly one model, got {len(models)}")
    if accelerator.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        raise ValueError(f"gradsched prepare: Accelerate's distributed type is {accelerator.distributed_type}; "
                         "gradsched replaces DDP only (launch with several processes, on CPU or GPU)")
    ddp_options = accelerator.ddp_handler.to_kwargs() if accelerator.ddp_handler is not None else {}
    hooks = [k for k in ("comm_hook", "comm_wrapper", "comm_state_option") if k in ddp_options]
    if hooks:
        raise ValueError(f"gradsched prepare: DistributedDataParallelKwargs({hooks[0]}=...) is a DDP communication "
                         "hook; gradsched schedules the communication itself")
    prepared = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            inner = accelerator.prepare_model(obj, evaluation_mode=True)  # device, autocast; no DDP
            device = next(inner.parameters()).device
            obj = DistributedDataParallel(inner, device_ids=None if device.type == "cpu" else [device],
                                          policy=policy, policy_options=policy_options, **ddp_options, **options)
        else:
            obj = accelerator.prepare(obj)
        prepared.append(obj)
    return prepared[0] if len(prepared) == 1 else tuple(prepared)
