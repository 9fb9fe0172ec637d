"""The plane's record of the current round: its life (:mod:`~gradsched.runtime.training.lifecycle`)
and what the training thread keeps of it (one backward pass that communicates, and the
forward pass before it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradsched.runtime.planning.profiling import RoundTiming
from gradsched.runtime.training.lifecycle import RoundLife


@dataclass
class Round:
    life: RoundLife = field(default_factory=RoundLife)
    grad_scale: float | None = None  # applied to this round's reduced gradients (join)
    homes: dict[int, torch.Tensor] = field(default_factory=dict)  # where its gradients are handed over
    timing: RoundTiming = field(default_factory=RoundTiming)  # of the forward pass and the backward after it
    ran: set[int] = field(default_factory=set)  # modules whose forward ran since the root's

    @property
    def index(self) -> int:
        """The latest round opened (0: none yet)."""
        return self.life.index
