"""DDP's switches for whether a pass communicates, kept as DDP keeps them.

* ``no_sync()``: backward passes inside accumulate locally (a depth: contexts nest);
* ``require_backward_grad_sync``: False makes the backward pass after each forward pass that
  reads it accumulate locally, as ``no_sync()`` does (scripts set it per micro-step);
* ``require_forward_param_sync``: buffers are synced before a forward pass when the one before
  it trained and synced (and before the first); every forward pass sets it, as DDP's
  ``_post_forward`` does.

>>> s = SyncSwitches()
>>> s.forward_began(grad_enabled=True), s.local
((True, True), False)
>>> s.backward = False; s.forward_ended(grad_enabled=True)
>>> s.forward_began(grad_enabled=True), s.local, s.param
((False, False), True, False)
"""

from __future__ import annotations


class SyncSwitches:
    def __init__(self) -> None:
        self.depth = 0  # no_sync() contexts entered
        self.backward = True  # require_backward_grad_sync
        self.param = True  # require_forward_param_sync
        self._accumulating = False  # the latest forward pass began with `backward` False

    @property
    def enabled(self) -> bool:
        """Whether a backward pass now would communicate (neither switch turned off)."""
        return not self.depth and self.backward

    @property
    def local(self) -> bool:
        """Whether the backward pass running now accumulates locally."""
        return bool(self.depth) or self._accumulating

    def training(self, grad_enabled: bool) -> bool:
        """Whether a forward pass now begins an iteration that communicates."""
        return grad_enabled and self.enabled

    def forward_began(self, grad_enabled: bool) -> tuple[bool, bool]:
        """(the backward pass after it communicates, buffers are synced before it)."""
        self._accumulating = not self.backward
        return self.training(grad_enabled), self.param

    def forward_ended(self, grad_enabled: bool) -> None:
        self.param = self.training(grad_enabled)
