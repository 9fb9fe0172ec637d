"""Backward's side of a round on gradsched's data plane: each gradient as autograd accumulates it.

* a post-accumulate-grad hook per parameter hands each gradient over (moved into its home in
  the plan's flat buffer, stamped with the clock's event, left in ``.grad`` in flight);
* the first gradient after a forward pass opens the round (:mod:`~gradsched.runtime.training.lifecycle`);
* with ``find_unused_parameters``, the last gradient the backward pass gives (or its close)
  settles the parameters it left without one, as DDP does (:mod:`gradsched.runtime.training.unused`);
* a rank that has joined (``join()``) hands over zeros for a round it shadows.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from gradsched.runtime.errors import GradschedError
from gradsched.runtime.training.inflight import plain
from gradsched.runtime.training.unused import UnusedParameters, agree_unused


class Intake:
    def __init__(self, plane: Any, find_unused: bool) -> None:
        """``plane``: the :class:`~gradsched.runtime.training.plane.Plane` this is part of."""
        self.plane = weakref.proxy(plane)  # which holds this: no cycle to outlive close()
        self.unused = UnusedParameters(plane.params) if find_unused else None
        self.globally_unused: set[int] = set()  # used on no rank in the latest settled backward pass

    def on_grad(self, p: torch.Tensor) -> None:
        plane = self.plane
        if plane.closed:
            return
        i = plane.index[id(p)]
        grad = plain(p.grad)  # None: an undefined gradient reached this parameter
        if plane.sync.local:
            if self.unused is not None and grad is not None:
                self.unused.local_gradient(i)
            return
        if plane.current.life.gradient():  # the first gradient after a forward pass: a new round
            plane.start_round()
            if self.unused is not None:
                self.unused.begin()  # which parameters will this backward pass reach?
        if grad is not None:
            self._hand_over(i, grad)
        if self.unused is not None and self.unused.report(i, grad is not None):
            self.settle_unused()  # the last gradient this backward pass gives the model

    def _hand_over(self, i: int, grad: torch.Tensor) -> None:
        plane, current = self.plane, self.plane.current
        name = plane.names[i]
        if plane.exchange.ready_round[i] == current.index:
            raise GradschedError(
                f"parameter {name!r} received a gradient twice in one backward pass; run one "
                "backward per forward, and use no_sync() for backward passes that should not communicate"
            )
        grad = plane.handover.place(grad, current.homes.get(i))
        timing, key = current.timing, ("ready", name)
        now = timing.ready[name] = plane.clock.stamp(timing, key)  # its event: also where it was produced
        if plane.trace:
            plane.trace.ready(current.index, name, now, backward_from=timing.forward_end)
        plane.handover.hand_over(i, grad, current.index, current.grad_scale,
                                 produced=plane.device.produced(timing.events.get(key)))

    def close(self) -> None:
        """The round's backward pass is over: settle what it left unused, if it ended early."""
        if self.unused is not None and self.unused.open:  # the backward pass ended early (it raised)
            self.settle_unused()

    def settle_unused(self) -> None:
        """``find_unused_parameters``: the backward pass is over, so every parameter it gave no
        gradient is handed over now (see :mod:`gradsched.runtime.training.unused`)."""
        plane = self.plane
        current, exchange, handover = plane.current, plane.exchange, plane.handover
        self.globally_unused = self.agree(self.unused.settle(len(plane.params)))
        for i in [i for i in range(len(plane.params)) if exchange.ready_round[i] != current.index]:
            p = plane.params[i]
            if i in handover.unsettled or plane.updates.pending(i):  # its previous round first (NCCL: ran)
                plane.updates.wait_and_apply([i], f"parameter {plane.names[i]!r}")
            home = current.homes.get(i)
            held = plain(p.grad)
            if i in self.globally_unused:  # used nowhere: .grad stays as it is
                if home is not None and held is home:  # .grad lives where the message reduces: restored after
                    handover.hand_over(i, home, current.index, keep=home.clone())
                else:
                    handover.lend(i, home.zero_() if home is not None else torch.zeros_like(p), current.index)
                continue
            with torch.no_grad():  # used elsewhere: reduced with what this rank holds, as DDP does
                if held is None:
                    contribution = home.zero_() if home is not None else torch.zeros_like(p)
                elif home is not None:
                    contribution = home if held is home else home.copy_(held)
                else:
                    contribution = held.detach().contiguous()
            handover.hand_over(i, contribution, current.index, current.grad_scale)

    def agree(self, missing: list[int]) -> set[int]:
        """The parameters no rank gave a gradient, from this rank's ``missing`` (a collective)."""
        plane = self.plane
        return agree_unused(missing, len(plane.params), plane.topology.control if plane.world_size > 1
                            else None, plane.explain)

    def shadow(self) -> None:
        """On a rank that has joined: zeros for every gradient of the round it takes part in."""
        plane = self.plane
        everything = range(len(plane.params))
        for i in everything:
            home = plane.current.homes.get(i)
            plane.handover.lend(i, home.zero_() if home is not None else torch.zeros_like(plane.params[i]),
                                plane.current.index)
        plane.sparse.shadow()  # the training ranks reduce theirs in backward()
        if self.unused is not None:
            # counted as using every parameter, as DDP's joined ranks are: while a rank has
            # joined, a parameter the others all left unused gets a zero gradient, not none
            self.agree([])
        plane.handover.wait(everything, "zero gradients shadowing the ranks still training (join)")

    def detach(self) -> None:
        if self.unused is not None:
            self.unused.close()
