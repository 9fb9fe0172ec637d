"""The architecture stays visible: import directions, a torch-free core and control plane,
small modules and functions. The import rules are checked on the source (every import
statement, also inside functions), and the checker itself is shown to catch violations."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PURE = ("torch", "numpy", "threading", "_thread", "time", "asyncio", "concurrent", "multiprocessing", "random", "socket")

# (modules the rule applies to, imports they must not make, exceptions to the rule)
RULES = [
    ("gradsched.core", (*PURE, "gradsched"), ("gradsched.core", "gradsched.units")),
    ("gradsched.control", (*PURE, "gradsched"), ("gradsched.control", "gradsched.core", "gradsched.units")),
    ("gradsched.sim", ("torch", "threading", "gradsched.runtime", "gradsched.bench", "gradsched.tune",
                       "gradsched.control", "gradsched.cli"), ()),
    ("gradsched.models", ("gradsched.sim", "gradsched.runtime", "gradsched.bench", "gradsched.tune",
                          "gradsched.control"), ()),
    ("gradsched.tune", ("gradsched.runtime", "gradsched.bench", "gradsched.cli"), ()),
    ("gradsched.runtime", ("gradsched.bench", "gradsched.cli", "gradsched.tune.cli"), ()),
    ("gradsched.runtime.training.lifecycle", (*PURE, "gradsched"), ()),  # the round's life: a pure state machine
]
# only the module that makes plans and predictions uses the simulator
SIM_USERS_IN_RUNTIME = {"gradsched.runtime.planning.planner", "gradsched.runtime.planning.prediction"}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports(module: str, source: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports (relative imports resolved against ``module``)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)  # submodules imported by name
    return found


def violations(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """Broken rules in ``modules`` (name -> (source, is_package))."""
    broken = []
    for module, (source, is_package) in sorted(modules.items()):
        found = imports(module, source, is_package)
        for scope, forbidden, allowed in RULES:
            if not _within(module, scope):
                continue
            for name in sorted(found):
                if any(_within(name, f) for f in forbidden) and not any(_within(name, a) for a in allowed):
                    broken.append(f"{module} imports {name}")
        if _within(module, "gradsched.runtime") and module not in SIM_USERS_IN_RUNTIME:
            broken += [f"{module} imports {name} (only planning uses the simulator)"
                       for name in sorted(found) if _within(name, "gradsched.sim")]
    return broken


def project_modules() -> dict[str, tuple[str, bool]]:
    modules = {}
    for path in (SRC / "gradsched").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (path.read_text(), is_package)
    return modules


def test_import_directions():
    assert violations(project_modules()) == []


def circles(modules: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a circle (every import
    counts, those under ``if TYPE_CHECKING:`` too; importing a module's own package does not,
    as Python loads a package before its modules anyway)."""
    graph = {m: sorted(n for n in imports(m, src, pkg) if n in modules and n != m and not m.startswith(n + "."))
             for m, (src, pkg) in modules.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_no_import_circles():
    assert circles(project_modules()) == []


def test_the_circle_checker_catches_circles():
    modules = {
        "gradsched.runtime.comm.exchange": ("from .launcher import Launcher", False),
        "gradsched.runtime.comm.launcher": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from .exchange import Exchange", False),
        "gradsched.runtime.comm": ("", True),
        "gradsched.runtime.comm.board": ("from . import launcher", False),
    }
    assert circles(modules) == [["gradsched.runtime.comm.exchange", "gradsched.runtime.comm.launcher"]]


@pytest.mark.parametrize("module,source", [
    ("gradsched.core.engine", "import time"),
    ("gradsched.core.engine", "def f():\n    import threading"),
    ("gradsched.core.task", "from torch import nn"),
    ("gradsched.core.task", "from ..sim import simulate"),
    ("gradsched.core.policies.fifo", "from ...runtime import wrap"),
    ("gradsched.control.arms", "from ..tune import Tuner"),
    ("gradsched.sim.simulator", "from gradsched.runtime.comm.exchange import Exchange"),
    ("gradsched.runtime.comm.exchange", "from ...sim.plan_maker import make_plan"),
    ("gradsched.runtime.architectures.servers.pushpull", "from .... import sim"),
])
def test_the_checker_catches_violations(module, source):
    assert violations({module: (source, False)}), f"{module}: {source!r} was not caught"


def test_the_checker_resolves_relative_imports():
    assert imports("gradsched.core.policies", "from ..task import CommTask", is_package=True) >= {"gradsched.core.task"}
    assert imports("gradsched.core.policies.fifo", "from ..task import CommTask") >= {"gradsched.core.task"}
    assert violations({"gradsched.runtime.planning.planner": ("from ..sim import make_plan", False)}) == []
    assert violations({"gradsched.core.engine": ("from .task import CommTask\nfrom ..units import parse_bytes",
                                                 False)}) == []


def test_core_simulator_and_control_load_without_torch():
    code = ("import sys, gradsched.core, gradsched.control, gradsched.sim, gradsched.sim.compare; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_module_says_what_it_holds():
    """One concern per module, stated first: its docstring (docs/layout.md gathers them). Where a
    module's docstring needs "and" for two unrelated things, split the module, whatever its length."""
    for path in (SRC / "gradsched").rglob("*.py"):
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" and not tree.body:
            continue
        doc = ast.get_docstring(tree)
        assert doc and len(doc.split()) >= 4, f"{path.relative_to(SRC)}: say what the module holds, in its docstring"


from gradsched.core.architectures import NAMES  # noqa: E402 - torch-free

ARCHITECTURE_NAMES = {*NAMES, "ddp-reducer"}  # every name, the one DDP's reducer goes by included
THE_LIST = "gradsched/core/architectures.py"  # the one list of names
FACTORY = "gradsched/runtime/architectures/choice.py"  # the one place that builds an object from a name


def architecture_branches(source: str) -> list[int]:
    """Lines of ``source`` that compare with an architecture's name or read the
    ``architecture`` option: what only the factory may do."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(v, ast.Constant) and v.value in ARCHITECTURE_NAMES for v in values):
                    found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "architecture" and \
                isinstance(node.value, (ast.Name, ast.Attribute)) and "config" in ast.unparse(node.value):
            found.append(node.lineno)
    return sorted(set(found))


def test_only_the_factory_asks_which_architecture():
    """Nothing in gradsched branches on an architecture's name: in the runtime the object chosen
    once (gradsched.runtime.architectures.choice) answers, elsewhere (the simulator, the bench,
    the CLI) what the one list says of it (gradsched.core.architectures)."""
    offenders = []
    for path in (SRC / "gradsched").rglob("*.py"):
        relative = path.relative_to(SRC).as_posix()
        if relative not in (FACTORY, THE_LIST):
            offenders += [f"{relative}:{line}" for line in architecture_branches(path.read_text())]
    assert offenders == []


def test_every_list_of_architectures_is_the_one_list():
    """The runtime's factory, the simulator's clusters and the CLI take the names of one list."""
    from gradsched.cli import build_parser
    from gradsched.runtime.architectures.choice import BUILT
    from gradsched.sim import ARCHITECTURES

    assert tuple(BUILT) == NAMES and ARCHITECTURES == NAMES
    simulate = build_parser()._subparsers._group_actions[0].choices["simulate"]
    arch = next(a for a in simulate._actions if "--arch" in a.option_strings)
    assert tuple(arch.choices) == NAMES


# the runtime's packages, lowest first: a module imports only from its own package or one below
# (every import counts: inside functions and under TYPE_CHECKING too); the top-level modules
# (config, errors, torch_api, torch_private) are below every package
RUNTIME_LAYERS = ["device", "diagnostics", "comm", "planning", "training", "architectures", "frontend"]


def upward_imports(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """Imports in ``modules`` from a runtime package above the importing module's."""

    def layer(name: str) -> int | None:
        parts = name.split(".")
        if parts[:2] != ["gradsched", "runtime"] or len(parts) < 3:
            return None
        return RUNTIME_LAYERS.index(parts[2]) if parts[2] in RUNTIME_LAYERS else -1

    found = []
    for module, (source, is_package) in sorted(modules.items()):
        own = layer(module)
        if own is None:
            continue
        found += [f"{module} imports {name}" for name in sorted(imports(module, source, is_package))
                  if (theirs := layer(name)) is not None and theirs > own]
    return found


def test_no_runtime_import_points_up():
    assert upward_imports(project_modules()) == []


@pytest.mark.parametrize("module,source", [
    ("gradsched.runtime.comm.exchange", "from gradsched.runtime.training.inflight import Handover"),
    ("gradsched.runtime.planning.planner", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from ..architectures.allreduce import AllReduce"),
    ("gradsched.runtime.config", "def f():\n    from gradsched.runtime.device import device_for"),
])
def test_the_layer_checker_catches_imports_that_point_up(module, source):
    assert upward_imports({module: (source, False)}), f"{module}: {source!r} was not caught"


@pytest.mark.parametrize("source", ['if config.architecture == "ps": pass', 'x = self.config.architecture',
                                    'ok = arch in ("allreduce", "sharded")', 'if "sharded" != name: pass',
                                    'if cluster.arch == "fully_sharded": pass', 'if name != "ddp-reducer": pass'])
def test_the_branch_finder_finds_branches(source):
    assert architecture_branches(source) == [1]


def test_the_runtime_is_in_packages_named_for_what_they_hold():
    top = sorted(p.name for p in (SRC / "gradsched" / "runtime").glob("*.py"))
    assert top == ["__init__.py", "config.py", "errors.py", "torch_api.py", "torch_private.py"]  # torch_*: what torch offers
    packages = sorted(p.name for p in (SRC / "gradsched" / "runtime").iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(RUNTIME_LAYERS)


@pytest.mark.parametrize("package", ["runtime", "bench"])
def test_functions_stay_short(package):
    for path in (SRC / "gradsched" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, f"{path.name}: {node.name} has {length} lines: split it"


def test_the_layout_page_names_every_module():
    page = (SRC.parent / "docs" / "layout.md").read_text()
    layout = page[page.index("```"):]
    layout = layout[: layout.index("```", 3)]
    missing = []
    for path in (SRC / "gradsched").rglob("*.py"):
        if path.name in ("__init__.py", "__main__.py") or path.parent.name == "policies":
            continue
        if path.name not in layout:
            missing.append(str(path.relative_to(SRC)))
    assert missing == [], f"docs/layout.md does not mention {missing}"



def test_nothing_received_is_unpickled():
    """torch.distributed's *_object collectives unpickle what peers send; gradsched exchanges
    structured data in its wire format (msgspec) or as tensors only."""
    unpickling = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                  "recv_object_list", "send_object_list", "pickle.loads")
    found = [f"{path.relative_to(SRC)}: {name}" for path in sorted((SRC / "gradsched").rglob("*.py"))
             for name in unpickling if name in path.read_text()]
    assert not found, found
