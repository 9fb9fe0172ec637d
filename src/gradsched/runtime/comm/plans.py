"""The plans a rank has adopted, each from the round it takes effect in.

Plans are agreed at control points (:mod:`gradsched.runtime.planning.planner`) and take effect
from a later round, while the launcher may still be sending an earlier round: so a rank
holds several. Each adopted plan has a *version*, its number in adoption order (the same on
every rank), which is how parameter servers are told which plan a round follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gradsched.core.plan import Plan
from gradsched.core.task import TensorSpec


@dataclass(frozen=True)
class Adopted:
    first_round: int  # the first round that follows it
    plan: Plan
    version: int  # 1, 2, ... in adoption order


class PlanVersions:
    """Adopted plans, and who wants to hear of each (not thread-safe: callers hold the
    exchange's lock)."""

    def __init__(self, first: Plan) -> None:
        self._adopted = [Adopted(1, first, 1)]
        self.count = 1  # plans adopted so far
        self._listeners: list[Callable[[Adopted], None]] = []

    def subscribe(self, listener: Callable[[Adopted], None]) -> None:
        """Call ``listener`` with every plan adopted from now on, and with the current ones."""
        self._listeners.append(listener)
        for adopted in self._adopted:
            listener(adopted)

    def adopt(self, plan: Plan, first_round: int) -> Adopted:
        """``plan`` applies from round ``first_round`` on (agreed by all ranks beforehand)."""
        self.count += 1
        adopted = Adopted(first_round, plan, self.count)
        self._adopted.append(adopted)
        for listener in self._listeners:
            listener(adopted)
        return adopted

    def for_round(self, round_index: int) -> Adopted:
        return max((a for a in self._adopted if a.first_round <= round_index), key=lambda a: a.first_round)

    def plan_for(self, round_index: int) -> Plan:
        return self.for_round(round_index).plan

    def forget_before(self, round_index: int) -> None:
        """Drop the plans no round from ``round_index`` on follows."""
        current = self.for_round(round_index)
        self._adopted = [a for a in self._adopted if a.first_round > round_index or a is current]

    def __contains__(self, version: int) -> bool:
        return any(a.version == version for a in self._adopted)


def tensor_specs(names: Sequence[str], params: Sequence[torch.Tensor],
                 wire: torch.dtype | None = None) -> list[TensorSpec]:
    """The scheduler's view of the gradients: priority and layer are the position in forward
    (parameter) order, so layers near the input are the most urgent; sizes are what travels
    (``wire``: the dtype of compressed messages)."""
    size = None if wire is None else torch.empty(0, dtype=wire).element_size()
    return [TensorSpec(name, p.numel(), layer=i, priority=i, element_size=size or p.element_size())
            for i, (name, p) in enumerate(zip(names, params))]
