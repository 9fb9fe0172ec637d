"""The Hugging Face ``Trainer`` with gradsched in DDP's place.

>>> from gradsched.integrations.transformers import GradschedTrainer        # doctest: +SKIP
>>> trainer = GradschedTrainer(model=model, args=args, train_dataset=train, eval_dataset=test,
...                            policy="prophet")                             # doctest: +SKIP
>>> trainer.train()                                                           # doctest: +SKIP

``GradschedTrainer`` is ``transformers.Trainer`` whose accelerator is a
:class:`gradsched.integrations.accelerate.GradschedAccelerator`: the Trainer builds its
``Accelerator`` as always (its DDP keywords from ``TrainingArguments``: ``ddp_find_unused_parameters``,
``ddp_bucket_cap_mb``, ``ddp_broadcast_buffers``), and where Accelerate would wrap the model in
PyTorch's DDP it is wrapped by :class:`gradsched.DistributedDataParallel`. The rest is the
Trainer's: ``gradient_accumulation_steps`` (the micro-steps run under the wrapper's
``no_sync()``), ``max_grad_norm`` (torch's clipping, which waits for gradients still on the
wire), evaluation, checkpoints (of the model without the wrapper, as under DDP: they load into
a plain model or another run), logging. Launch it as a DDP Trainer is launched (``torchrun``,
``accelerate launch``). ``trainer.gradsched_stats`` holds what the runtime measured
(:class:`gradsched.runtime.RunStats`) once training ends. Installed by
``pip install gradsched[accelerate]``.
"""

from __future__ import annotations

from typing import Any

from ..extras import require

require("transformers", "accelerate")
require("accelerate", "accelerate")
from transformers import Trainer  # noqa: E402

from gradsched.runtime.frontend.ddp import DistributedDataParallel  # noqa: E402
from .accelerate import GradschedAccelerator  # noqa: E402


class GradschedTrainer(Trainer):
    """``transformers.Trainer`` with gradsched: ``policy``, ``policy_options`` and ``gradsched``
    (any other :class:`gradsched.runtime.RuntimeConfig` option, a dict) are gradsched's; every
    other argument is the Trainer's."""

    def __init__(self, *args: Any, policy: str | None = None, policy_options: dict[str, Any] | None = None,
                 gradsched: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._gradsched_options = dict(gradsched or {}, policy=policy, policy_options=policy_options)
        self.gradsched_stats = None  # RunStats, once training ended
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's own accelerator, as a GradschedAccelerator: the same object and
        configuration, only its ``prepare_model`` wraps with gradsched."""
        super().create_accelerator_and_postprocess()
        self.accelerator.__class__ = GradschedAccelerator
        self.accelerator.gradsched_options = self._gradsched_options

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; when it returns, every update is applied (the model's weights can be
        read at once) and ``gradsched_stats`` holds what the runtime measured. The wrapper stays,
        as DDP's does, for a later ``train()``."""
        try:
            return super().train(*args, **kwargs)
        finally:
            wrapped = self.model_wrapped
            if isinstance(wrapped, DistributedDataParallel):
                wrapped.synchronize()
                self.gradsched_stats = wrapped.stats
