"""The parameters' all-gathers of ``architecture="fully_sharded"`` on the simulated link: the
runtime's :class:`~gradsched.core.gathers.GatherQueue`, fed where the runtime feeds it, each
gather submitted to the same FIFO link as the policy's reduce-scatters at the moment the queue
lets it go.

Every layer with parameters is a unit (:func:`table_units`; the runtime describes its own
units for plan making: :class:`~gradsched.core.gathers.GatherModel`). The simulator calls, in time order:

* :meth:`UnitGathers.begin_forward` when a forward pass begins (every freed unit queued in the
  order the previous pass ran them; the last ones the budget can keep marked to stay whole);
* :meth:`UnitGathers.need` before each unit's layer runs, forward and backward (the unit
  forced with everything queued before it); it answers when the unit is whole;
* :meth:`UnitGathers.free` after a unit's forward pass (unless kept) and once its backward
  pass has computed its gradients, before they are handed to the policy (gathers first);
* :meth:`UnitGathers.end_forward` when a forward pass ends (the freed units queued for the
  backward pass, the last run first).

>>> from gradsched.models.table import Layer, ModelTable, ParamSpec
>>> from gradsched.sim.network import Network
>>> model = ModelTable("two", (Layer("a", 1.0, 1.0, (ParamSpec("a.w", 250),)),
...                            Layer("b", 1.0, 1.0, (ParamSpec("b.w", 500),))))
>>> gathers = UnitGathers(table_units(model, None), Network(0.0, 1e-3))  # 1 ms a byte: 1 s, 2 s
>>> gathers.begin_forward(0.0)
>>> gathers.need(0, 0.0), gathers.need(1, 1.0)  # b's gather waits for room until a is freed
(1.0, 3.0)

Plan making sees one backward pass: :meth:`UnitGathers.backward_begins` sets the queue as a
forward pass leaves it, and :meth:`UnitGathers.computed` frees a unit once its last gradient is
computed.
"""

from __future__ import annotations

from typing import Callable

from ..core.gathers import GatherModel, GatherQueue, UnitState, default_budget
from ..models.table import ModelTable
from .network import Network, Transfer

#: told of every gather: (parameter names, bytes, issued at, its transfer)
OnGather = Callable[[tuple[str, ...], int, float, Transfer], None]


def table_units(model: ModelTable, budget_bytes: int | None) -> GatherModel:
    """Every layer with parameters a unit; ``budget_bytes``: ``gather_budget_mb`` in bytes (None:
    the runtime's default, the largest unit)."""
    layers = [layer for layer in model.layers if layer.params]
    sizes = tuple(sum(p.nbytes for p in layer.params) for layer in layers)
    return GatherModel(tuple(tuple(p.name for p in layer.params) for layer in layers), sizes,
                       budget_bytes or default_budget(sizes))


class UnitGathers:
    def __init__(self, model: GatherModel, network: Network, on_gather: OnGather | None = None) -> None:
        self.model = model
        self.queue = GatherQueue(model.sizes, model.budget)
        self.network = network
        self.on_gather = on_gather
        self.landed: dict[int, float] = {}  # unit -> when its latest gather completes
        self.kept: set[int] = set()  # units that stay whole from this forward pass to its backward pass
        self.order = list(range(len(model.sizes)))  # the units in the order the forward pass runs them
        self.unit_of = {name: u for u, names in enumerate(model.names) for name in names}
        self._computed: dict[int, int] = {}  # unit -> its gradients computed in this backward pass

    def _issue(self, at: float) -> None:
        queue = self.queue
        while queue.issuable():
            u = queue.issue()
            transfer = self.network.submit(queue.sizes[u], at)
            self.landed[u] = transfer.complete
            queue.landed(u)  # whole from then on: ``landed`` says when
            if self.on_gather is not None:
                self.on_gather(self.model.names[u], queue.sizes[u], at, transfer)

    def begin_forward(self, at: float) -> None:
        self.kept = self.queue.keep_after_forward(self.order)
        self.queue.want(self.order)
        self._issue(at)

    def end_forward(self, at: float) -> None:
        self._computed = {}
        self.queue.want([u for u in reversed(self.order) if self.queue.state[u] is UnitState.FREED])
        self._issue(at)

    def backward_begins(self, at: float) -> None:
        """The queue as a forward pass leaves it, at ``at``: the units the budget keeps whole, and
        the last one run (its backward pass came first: its gather is not this pass's link time);
        the others queued, the last run first, issued as the budget allows."""
        whole = self.queue.keep_after_forward(self.order) | set(self.order[-1:])
        self.queue.want([u for u in self.order if u in whole])
        self.queue.force_all()
        while self.queue.issuable():
            u = self.queue.issue()
            self.queue.landed(u)
            self.landed[u] = at
        self.end_forward(at)

    def need(self, u: int | None, at: float) -> float:
        """Unit ``u``'s layer would start at ``at`` (None: a layer with no parameters): when it
        can, its parameters whole."""
        if u is None:
            return at
        self.queue.need(u)
        self._issue(at)
        return max(at, self.landed[u])

    def free(self, u: int | None, at: float, forward: bool = False) -> None:
        """Unit ``u``'s pass ended at ``at``: freed (after a forward pass, unless kept)."""
        if u is None or (forward and u in self.kept):
            return
        if self.queue.free(u):
            self._issue(at)

    def computed(self, name: str, at: float) -> int | None:
        """Gradient ``name`` is computed at ``at``: the unit it completes (then freed), if any."""
        u = self.unit_of.get(name)
        if u is None:
            return None
        self._computed[u] = self._computed.get(u, 0) + 1
        if self._computed[u] < len(self.model.names[u]):
            return None
        self.free(u, at)
        return u
