"""A generated copy of PyTorch's DDP tests, pointed at another ``DistributedDataParallel``.

PyTorch ships its distributed tests in the wheel
(``torch/testing/_internal/distributed/distributed_test.py``, class
``DistributedTest._DistTestBase``). The copy made here differs from the installed file in two
ways only, both done on the syntax tree so that nothing else can change:

* every ``DistributedDataParallel`` the tests construct is the one of
  :mod:`target` (gradsched's, or PyTorch's own as the reference);
* the tests listed as ported in :mod:`selection` (upstream gates them on two GPUs, yet they
  need none) run on CPU: their ``skip_if_lt_x_gpu(n)`` gains ``allow_cpu=True`` and their
  device placement (``.cuda(...)``, ``.to(rank)``, ``device=rank``, ``device = self.rank``,
  ``device_ids=[rank]``, ``torch.cuda.set_device``, ``init_multigpu_helper``'s rank-to-GPU map)
  becomes CPU placement. What they assert is unchanged.

The copy is written once per installed torch (keyed by the source's hash) next to the other
generated files of the run, and imported under the name ``ddp_conformance_tests``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch.testing._internal.distributed as upstream_package

from selection import PORTED

UPSTREAM = Path(upstream_package.__file__).parent / "distributed_test.py"
MODULE = "ddp_conformance_tests"
_DDP_NAMES = {"DistributedDataParallel"}
_CPU = ast.Constant("cpu")


def is_ddp(node: ast.AST) -> bool:
    """``DistributedDataParallel``, ``nn.parallel.DistributedDataParallel`` or
    ``torch.nn.parallel.DistributedDataParallel``."""
    return isinstance(node, ast.Attribute) and node.attr in _DDP_NAMES and "parallel" in ast.unparse(node.value)


def _is_call_to(node: ast.AST, dotted: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == dotted


class _PointAtTarget(ast.NodeTransformer):
    """Every DDP the tests name is :mod:`target`'s."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.module == "torch.nn.parallel" and [a.name for a in node.names] == ["DistributedDataParallel"]:
            return ast.ImportFrom(module="target", names=[ast.alias("DistributedDataParallel")], level=0)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if is_ddp(node):
            return ast.copy_location(ast.Name("DistributedDataParallel", ast.Load()), node)
        return self.generic_visit(node)


class _OnCpu(ast.NodeTransformer):
    """Device placement to CPU inside one ported test (and the helpers it calls)."""

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        if ast.unparse(node.targets[0]) == "device" and _names_a_gpu(node.value):  # device = self.rank
            node.value = _CPU
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda":  # x.cuda(...) -> x
            return func.value
        if any(_is_call_to(node, f) for f in ("torch.cuda.set_device", "torch.cuda.synchronize")):
            return ast.copy_location(ast.Constant(None), node)
        if _is_call_to(node, "torch.cuda.current_device"):
            return ast.copy_location(_CPU, node)
        if _is_call_to(node, "init_multigpu_helper"):  # rank -> its "GPUs": on CPU, each rank itself
            world = node.args[0]
            mapping = ast.parse(f"{{r: [r] for r in range({ast.unparse(world)})}}", mode="eval").body
            return ast.copy_location(mapping, node)
        if isinstance(func, ast.Attribute) and func.attr == "to" and len(node.args) == 1 and _names_a_gpu(node.args[0]):
            node.args = [_CPU]
        if _is_call_to(node, "skip_if_lt_x_gpu") and not any(k.arg == "allow_cpu" for k in node.keywords):
            node.keywords.append(ast.keyword("allow_cpu", ast.Constant(True)))
        for keyword in node.keywords:
            if keyword.arg == "device" and _names_a_gpu(keyword.value):
                keyword.value = _CPU
            elif keyword.arg in ("device_ids", "output_device"):
                keyword.value = ast.Constant(None)
        return node


def _names_a_gpu(node: ast.AST) -> bool:
    """A rank used as a device index, or a CUDA device."""
    text = ast.unparse(node)
    return text in ("self.rank", "rank", "device_id") or text.startswith(("'cuda", "f'cuda"))


def _helpers(base: ast.ClassDef, names: set[str]) -> set[str]:
    """``names`` and every method of ``base`` they call through ``self``, transitively."""
    methods = {n.name: n for n in base.body if isinstance(n, ast.FunctionDef)}
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                todo.append(node.attr)
    return seen


def _base(tree: ast.AST) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")


def candidates(source: str) -> list[str]:
    """The tests of ``_DistTestBase`` that construct a DDP, directly or through its helpers."""
    base = _base(ast.parse(source))
    tests = [n.name for n in base.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    methods = {n.name: n for n in base.body if isinstance(n, ast.FunctionDef)}
    constructs = {name for name, fn in methods.items()
                  if any(isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", None))
                         == "DistributedDataParallel" for n in ast.walk(fn))}
    return [t for t in tests if _helpers(base, {t}) & constructs]


def generated_source(source: str) -> str:
    tree = _PointAtTarget().visit(ast.parse(source))
    base = _base(tree)
    port = _helpers(base, set(PORTED))
    for node in base.body:
        if isinstance(node, ast.FunctionDef) and node.name in port:
            _OnCpu().visit(node)
    ast.fix_missing_locations(tree)
    return ('"""Generated by tests/conformance/port.py from torch/testing/_internal/distributed/'
            'distributed_test.py: do not edit."""\n' + ast.unparse(tree) + "\n")


def ported_module() -> ModuleType:
    """Import the generated copy (writing it first if this torch's has not been written)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    source = UPSTREAM.read_text()
    key = hashlib.sha256((source + Path(__file__).read_text() + repr(sorted(PORTED))).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("GRADSCHED_CONFORMANCE_DIR") or Path(tempfile.gettempdir()) / "gradsched-conformance")
    folder = folder / key
    path = folder / f"{MODULE}.py"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(generated_source(source))
        os.replace(partial, path)  # ranks importing this at once see a whole file or none
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module(MODULE)
