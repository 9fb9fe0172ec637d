"""The conformance suite's selection and its generated copy, checked against the installed torch:
every candidate is either selected or excluded with a reason, the ported tests are exactly the
GPU-gated ones, and the copy changes device placement and the DDP class only."""

from __future__ import annotations

import ast

import pytest

from port import UPSTREAM, is_ddp, candidates, generated_source
from selection import EXCLUDED, PORTED, SELECTED

SOURCE = UPSTREAM.read_text()
GPU_GATES = ("skip_if_lt_x_gpu", "skip_if_no_gpu", "require_n_gpus_for_nccl_backend")


def methods(source: str) -> dict[str, ast.FunctionDef]:
    base = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")
    return {n.name: n for n in base.body if isinstance(n, ast.FunctionDef)}


@pytest.fixture(scope="module")
def generated() -> dict[str, ast.FunctionDef]:
    return methods(generated_source(SOURCE))


def test_every_candidate_is_selected_or_excluded_once():
    names = [s.name for s in SELECTED] + [e.name for e in EXCLUDED]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(candidates(SOURCE))
    assert all(e.why for e in EXCLUDED)


def test_the_ported_tests_are_the_ones_upstream_gates_on_gpus():
    upstream = methods(SOURCE)
    gated = {s.name for s in SELECTED
             if any(ast.unparse(d).startswith(GPU_GATES) for d in upstream[s.name].decorator_list)}
    assert gated == set(PORTED)


def _asserts(fn: ast.FunctionDef) -> list[str]:
    return [n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr.startswith("assert")]


def test_the_copy_keeps_what_each_selected_test_asserts(generated):
    upstream = methods(SOURCE)
    for s in SELECTED:
        assert _asserts(generated[s.name]) == _asserts(upstream[s.name]), s.name


def test_the_copy_runs_the_ported_tests_on_cpu_and_every_ddp_is_the_targets(generated):
    text = generated_source(SOURCE)
    assert not any(is_ddp(node) for node in ast.walk(ast.parse(text)))  # no torch.nn.parallel.DDP(...) left
    assert "from target import DistributedDataParallel" in text
    for name in PORTED:
        body = ast.unparse(generated[name])
        assert "allow_cpu=True" in body, name
        assert ".cuda(" not in body and "device=self.rank" not in body and "device_ids=[" not in body, name
    for s in SELECTED:
        if not s.ported:  # CPU tests upstream: unchanged but for the class they construct
            original = ast.unparse(methods(SOURCE)[s.name]).replace("torch.nn.parallel.", "").replace("nn.parallel.", "")
            assert ast.unparse(generated[s.name]) == original, s.name
