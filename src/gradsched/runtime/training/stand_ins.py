"""What a rank hands over for the gradients its backward pass did not produce, so that every
message of the round still completes on every rank: the parameters ``find_unused_parameters``
settles once the backward pass is over (:mod:`gradsched.runtime.training.unused`), and the zeros
of a rank that has joined (``join()``: :mod:`gradsched.runtime.training.join`) for every
gradient of a round it shadows."""

from __future__ import annotations

import torch

from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.training.inflight import Handover, plain
from gradsched.runtime.training.rounds import Round
from gradsched.runtime.training.run import Run
from gradsched.runtime.training.sparse import SparseGradients
from gradsched.runtime.training.unused import UnusedParameters, agree_unused


class StandIns:
    """For the plane of ``run``: its current round, exchange, handover and sparse gradients,
    and the unused-parameter search (None without ``find_unused_parameters``)."""

    def __init__(self, run: Run, current: Round, exchange: Exchange, handover: Handover,
                 unused: UnusedParameters | None, sparse: SparseGradients) -> None:
        self.run, self.current, self.exchange, self.handover = run, current, exchange, handover
        self.unused, self.sparse = unused, sparse

    def settle_unused(self) -> None:
        """``find_unused_parameters``: the backward pass is over, so every parameter it gave no
        gradient is handed over now (see :mod:`gradsched.runtime.training.unused`)."""
        run, current, handover = self.run, self.current, self.handover
        globally_unused = self.agree(self.unused.settle(len(run.params)))
        for i in [i for i in range(len(run.params)) if self.exchange.ready_round[i] != current.index]:
            p = run.params[i]
            if i in handover.unsettled or run.updates.pending(i):  # its previous round first (NCCL: ran)
                run.updates.wait_and_apply([i], f"parameter {run.names[i]!r}")
            home = current.homes.get(i)
            held = plain(p.grad)
            if i in globally_unused:  # used nowhere: .grad stays as it is
                if home is not None and held is home:  # .grad lives where the message reduces: restored after
                    handover.hand_over(i, home, current.index, keep=home.clone())
                else:
                    handover.lend(i, _zeros(home, p), current.index)
                continue
            with torch.no_grad():  # used elsewhere: reduced with what this rank holds, as DDP does
                if held is None:
                    contribution = _zeros(home, p)
                elif home is not None:
                    contribution = home if held is home else home.copy_(held)
                else:
                    contribution = held.detach().contiguous()
            handover.hand_over(i, contribution, current.index, current.grad_scale)

    def agree(self, missing: list[int]) -> set[int]:
        """The parameters no rank gave a gradient, from this rank's ``missing`` (a collective)."""
        run = self.run
        return agree_unused(missing, len(run.params), run.topology.control if run.world_size > 1 else None,
                            run.explain)

    def shadow_with_zeros(self) -> None:
        """On a rank that has joined: zeros for every gradient of the round it takes part in."""
        everything = range(len(self.run.params))
        for i in everything:
            self.handover.lend(i, _zeros(self.current.homes.get(i), self.run.params[i]), self.current.index)
        self.sparse.shadow()  # the training ranks reduce theirs in backward()
        if self.unused is not None:
            # counted as using every parameter, as DDP's joined ranks are: while a rank has
            # joined, a parameter the others all left unused gets a zero gradient, not none
            self.agree([])
        self.handover.wait(everything, "zero gradients shadowing the ranks still training (join)")


def _zeros(home: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Zeros where a gradient of ``like`` is handed over from: its home zeroed, or new memory."""
    return home.zero_() if home is not None else torch.zeros_like(like)

