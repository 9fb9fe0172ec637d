"""The coordinator's record of the current round: one backward pass that communicates, and
the forward pass before it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .profiling import RoundTiming


@dataclass
class Round:
    index: int = 0  # the latest round begun (0: none yet)
    open: bool = False  # its backward pass handed gradients over and the round was not closed yet
    next_begins: bool = True  # the next gradient handed over begins a new round
    forward_ran: bool = False  # a forward pass ran since the latest round closed
    grad_scale: float | None = None  # applied to this round's reduced gradients (join)
    homes: dict[int, torch.Tensor] = field(default_factory=dict)  # where its gradients are handed over
    timing: RoundTiming = field(default_factory=RoundTiming)  # of the forward pass and the backward after it
    ran: set[int] = field(default_factory=set)  # modules whose forward ran since the root's

    def begin(self, homes: dict[int, torch.Tensor]) -> None:
        """The first gradient of a new round is being handed over."""
        self.index += 1
        self.next_begins = False
        self.open = True
        self.homes = homes
