"""Which module's forward pass waits for which parameters (the Dependency Proxy's map).

A module that owns parameters directly waits, in its forward pre-hook, for their reductions and
updates. A parameter held by a container that never runs (``nn.ParameterList``, a parameter of
one module used by another) is *adopted*: once a backward pass shows it got a gradient though
no module owning it ran, the nearest ancestor of its owner that did run waits for it from then
on (the root, at worst).
"""

from __future__ import annotations

from typing import Callable

from torch import nn


class ModuleWaits:
    def __init__(self, model: nn.Module, index: dict[int, int]) -> None:
        """``index``: ``id(parameter)`` -> its position among the parameters communicated."""
        self.model = model
        named = dict(model.named_modules())
        self.name = {m: n for n, m in named.items()}
        self._parent = {m: named[n.rpartition(".")[0]] for n, m in named.items() if n}
        self.of: dict[nn.Module, list[int]] = {}  # module -> the parameters its forward waits for
        self._owners: dict[int, list[nn.Module]] = {}  # parameter -> modules owning it directly
        self._adopted: set[int] = set()  # parameters waited for by an ancestor of their owner
        self.hooked = {model}  # modules that get a forward pre-hook: owners and their ancestors
        for module in model.modules():
            idx = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if idx:
                self.of[module] = idx
                for i in idx:
                    self._owners.setdefault(i, []).append(module)
                ancestor = module
                while ancestor not in self.hooked:  # its ancestors may adopt its parameters
                    self.hooked.add(ancestor)
                    ancestor = self._parent[ancestor]

    def owners(self, names: list[str]) -> dict[str, list[str]]:
        """Module name -> the names of the parameters its forward waits for (the planner's view)."""
        return {self.name[m]: [names[i] for i in idx] for m, idx in self.of.items()}

    def adopt_orphans(self, got_gradient: Callable[[int], bool], ran: set[int],
                      adopted: Callable[[int, str], None]) -> None:
        """After a backward pass: every parameter that ``got_gradient`` though no module owning
        it is in ``ran`` (ids of the modules whose forward ran) is adopted by the nearest
        ancestor of its owner that ran; ``adopted(parameter, module name)`` is told."""
        for i in sorted(self._owners):
            owners = self._owners[i]
            if i in self._adopted or not got_gradient(i) or any(id(m) in ran for m in owners):
                continue
            adopter = owners[0]
            while adopter is not self.model and id(adopter) not in ran:
                adopter = self._parent[adopter]
            self._adopted.add(i)
            self.of.setdefault(adopter, []).append(i)
            adopted(i, self.name[adopter])
