"""DDP's switches for whether a pass communicates, kept as DDP keeps them.

* ``no_sync()``: a forward pass run inside does not make the backward pass after it communicate
  (a depth: contexts nest); as with DDP it is the forward passes that decide, wherever the
  backward pass runs;
* ``require_backward_grad_sync``: False makes the forward passes that read it leave their
  backward passes local, as ``no_sync()`` does (scripts set it per micro-step);
* what DDP's reducer keeps between them: a forward pass with gradients and both switches on
  makes the next backward pass communicate, and only the end of that backward pass (here: its
  round closed) makes backward passes local again; a forward pass inside ``no_sync()`` changes
  neither (so one that follows a forward pass with no backward pass still communicates, and a
  second backward pass over one forward pass, ``retain_graph``, accumulates locally);
* ``require_forward_param_sync``: buffers are synced before a forward pass when the one before
  it trained and synced (and before the first); every forward pass sets it, as DDP's
  ``_post_forward`` does.

>>> s = SyncSwitches()
>>> s.local  # no forward pass that syncs yet
True
>>> s.forward_began(grad_enabled=True), s.local
((True, True), False)
>>> s.round_closed(); s.backward = False; s.forward_ended(grad_enabled=True)
>>> s.forward_began(grad_enabled=True), s.local, s.param
((False, False), True, False)
>>> s.backward = True; s.local  # a backward pass now still belongs to the forward pass before
True
"""

from __future__ import annotations


class SyncSwitches:
    def __init__(self) -> None:
        self.depth = 0  # no_sync() contexts entered
        self.backward = True  # require_backward_grad_sync
        self.param = True  # require_forward_param_sync
        self._expecting = False  # a forward pass that syncs ran, and no backward pass since has communicated

    @property
    def enabled(self) -> bool:
        """Whether a backward pass now would communicate (neither switch turned off)."""
        return not self.depth and self.backward

    @property
    def local(self) -> bool:
        """Whether the backward pass running now accumulates locally: no forward pass that syncs
        ran since the latest backward pass that communicated (DDP's reducer expects none)."""
        return not self._expecting

    def round_closed(self) -> None:
        """A backward pass that communicated is over (DDP's reducer finalized it)."""
        self._expecting = False

    def training(self, grad_enabled: bool) -> bool:
        """Whether a forward pass now begins an iteration that communicates."""
        return grad_enabled and self.enabled

    def forward_began(self, grad_enabled: bool) -> tuple[bool, bool]:
        """(the backward pass after it communicates, buffers are synced before it)."""
        if self.training(grad_enabled):
            self._expecting = True
        return self.training(grad_enabled), self.param

    def forward_ended(self, grad_enabled: bool) -> None:
        self.param = self.training(grad_enabled)
