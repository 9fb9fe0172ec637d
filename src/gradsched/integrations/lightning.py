"""A PyTorch Lightning strategy that trains with gradsched instead of DDP.

>>> trainer = lightning.Trainer(strategy=GradschedStrategy(policy="prophet"), accelerator="cpu",
...                             devices=2)                                          # doctest: +SKIP

It is Lightning's own ``DDPStrategy`` (launch, process groups, samplers, checkpoints,
precision plugins) with the model wrapped by :class:`gradsched.DistributedDataParallel` in
place of PyTorch's. What Lightning does around the optimizer works unchanged: automatic
optimisation calls ``optimizer.step(closure)`` (gradsched binds the optimizer the first time),
``gradient_clip_val`` clips with torch's own functions (gradients still on the wire are
waited for as they are read), ``accumulate_grad_batches`` runs the backward passes between
steps under ``no_sync()``, and checkpoints see every update applied. Installed by
``pip install gradsched[lightning]``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from ..extras import require

require("lightning", "lightning")
import torch  # noqa: E402
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry  # noqa: E402

from gradsched.runtime.frontend.ddp import DistributedDataParallel  # noqa: E402


class GradschedStrategy(DDPStrategy):
    """``DDPStrategy`` with gradsched: ``policy``, ``policy_options`` and any
    :class:`gradsched.runtime.RuntimeConfig` option as keywords; DDP's own keywords
    (``find_unused_parameters``, ``bucket_cap_mb``, ...) as ``DDPStrategy`` takes them, and
    ``ddp_comm_state``/``ddp_comm_hook``/``ddp_comm_wrapper`` (a DDP communication hook, run on
    the policy's messages, on CPU too). Post-local-SGD averaging is refused."""

    strategy_name = "gradsched"

    def __init__(self, policy: str | None = None, policy_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        if kwargs.get("model_averaging_period") is not None:
            raise ValueError("GradschedStrategy: model_averaging_period= (post-local SGD) replaces DDP's optimizer "
                             "step with periodic averaging; gradsched averages every step's gradients")
        super().__init__(**kwargs)
        self._policy = policy
        self._policy_options = policy_options
        self.stats = None  # what the last fit's runtime measured and decided (RunStats), once it ended

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """``Trainer(strategy="gradsched")`` (only this name: not DDP's, which the parent registers)."""
        if "gradsched" not in strategy_registry:
            strategy_registry.register("gradsched", cls, description="DDP with gradsched scheduling its communication")

    def _setup_model(self, model: Any) -> DistributedDataParallel:
        return DistributedDataParallel(model, device_ids=self.determine_ddp_device_ids(), policy=self._policy,
                                       policy_options=self._policy_options, **self._ddp_kwargs)

    def _register_ddp_hooks(self) -> None:
        """The communication hook asked for, on every device type (Lightning's registers it on CUDA only)."""
        if self._ddp_comm_hook is not None:
            _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state,
                                    ddp_comm_hook=self._ddp_comm_hook, ddp_comm_wrapper=self._ddp_comm_wrapper)

    def pre_backward(self, closure_loss: Any) -> None:
        """No DDP reducer to prepare (Lightning prepares it in manual optimisation): gradsched's hooks
        find the gradients themselves. DDP's buffer-sync flag is set as Lightning sets it."""
        if isinstance(self.model, DistributedDataParallel) and not self.lightning_module.automatic_optimization:
            self.model.require_forward_param_sync = torch.is_grad_enabled() and self.model.require_backward_grad_sync

    def post_backward(self, closure_loss: Any) -> None:
        pass  # DDP's first-iteration flush of a static graph: gradsched has nothing to flush

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Backward passes between optimizer steps (gradient accumulation) stay local."""
        if isinstance(self.model, DistributedDataParallel):
            with self.model.no_sync():
                yield
        else:
            yield

    def teardown(self) -> None:
        if isinstance(self.model, DistributedDataParallel):
            self.stats = self.model.stats
            self.model.close()  # finish communication, apply every update, detach
            self.model = self.lightning_module
        super().teardown()


GradschedStrategy.register_strategies(StrategyRegistry)
