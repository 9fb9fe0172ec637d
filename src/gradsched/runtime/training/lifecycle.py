"""The life of a round on the training thread, as a small state machine (no torch, no threads).

A *round* is one backward pass that communicates. Its life:

* ``forward()``: the model's forward pass begins (the root's pre-hook); the round before, if
  still open, is closed first (its backward pass is over) and the next gradient handed over
  begins a new round;
* ``gradient()``: a gradient is handed over; the first one after a forward pass opens round
  ``index + 1`` (``True``: the caller sets the round up); later ones belong to it;
* ``close()``: the backward pass is over (the next forward pass, ``step()``,
  ``synchronize()``): every gradient must have been handed over (``True``: the caller
  checks and settles the round); closing twice does nothing;
* ``stepped()``: the optimizer stepped after the round: its control point comes due;
* ``shadowed()``: a rank that has joined (``join()``) takes part in a round with zeros: it
  opens and closes at once, as if a forward and backward pass had run.

Between a round's close and the next forward pass the parameters that got a gradient though
no module owning them ran are adopted once (``orphans_due()``). Every transition is written to
``trace`` when one is given (tests replay exact sequences)."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    IDLE = "idle"  # no forward pass since the latest round opened (or none yet)
    FORWARD = "forward"  # a forward pass ran: the next gradient opens a round
    OPEN = "open"  # the round's backward pass hands gradients over
    CLOSED = "closed"  # its backward pass is over
    STEPPED = "stepped"  # the optimizer stepped after it: its control point is due


class RoundLife:
    def __init__(self, trace: list[str] | None = None) -> None:
        self.index = 0  # the latest round opened (0: none yet)
        self.phase = Phase.IDLE
        self._forward_ran = False  # a forward pass ran since the latest round closed (orphans to look for)
        self._next_opens = True  # the next gradient opens a new round
        self.trace = trace
        self.active_at = 0.0  # when the latest forward pass began (or the wrap), on the caller's monotonic
        self.joined = False  # the rank has left the loop and shadows the others' rounds (join())
        self.closed = False  # the rank runs no more rounds (the wrap was closed)
        #   clock: the rank's progress, for peers asking after a failure

    def _say(self, event: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{event}: round {self.index} {self.phase.value}")

    @property
    def open(self) -> bool:
        return self.phase is Phase.OPEN

    def forward(self) -> None:
        """A forward pass begins (the caller has closed the open round first)."""
        if self.open:
            raise RuntimeError("close the open round before the next forward pass")
        self._forward_ran = self._next_opens = True
        self.phase = Phase.FORWARD
        self._say("forward")

    def gradient(self) -> bool:
        """A gradient is handed over: whether it opens a new round (``index`` is then its number)."""
        if not self._next_opens:
            return False
        self.index += 1
        self._next_opens = False
        self.phase = Phase.OPEN
        self._say("gradient")
        return True

    def close(self) -> bool:
        """The backward pass is over: whether a round was open (the caller settles it)."""
        if not self.open:
            return False
        self.phase = Phase.CLOSED
        self._say("close")
        return True

    def orphans_due(self) -> bool:
        """Whether to look for orphaned parameters now (once per forward pass, after the close)."""
        due, self._forward_ran = self._forward_ran, False
        return due

    def stepped(self) -> None:
        """The optimizer stepped after the latest round (closed first)."""
        if self.open:
            raise RuntimeError("close the open round before stepping")
        if self.index:
            self.phase = Phase.STEPPED
        self._say("stepped")

    def shadowed(self) -> None:
        """A round taken part in with zeros (a rank that joined): opened and closed at once."""
        if self.open:
            raise RuntimeError("close the open round before shadowing one")
        self.index += 1
        self.phase = Phase.CLOSED
        self._next_opens = True
        self._say("shadowed")

    @property
    def in_forward(self) -> bool:
        """A forward pass ran and its backward pass has not handed anything over yet."""
        return self._next_opens and self._forward_ran
