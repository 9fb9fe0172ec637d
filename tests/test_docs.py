"""The measured figures can be checked: each table of the README, docs/tuning.md and docs/runtime.md is
exactly what a script in benchmarks/ prints from the JSON committed under docs/figures."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def figure(name: str) -> dict:
    return json.loads((ROOT / "docs" / "figures" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["bench-replay-resnet50", "bench-replay-transformer", "bench-replay-vgg16-balance",
                                  "bench-replay-resnet50-ps", "bench-k3-resnet50", "bench-k3-transformer",
                                  "bench-k3-vgg16-balance", "bench-k3-ps-resnet50",
                                  "bench-sharded-resnet50-k3"])
def test_the_readme_measured_tables_are_what_their_json_prints(name):
    assert script("bench_table").table(figure(name)) in README


@pytest.mark.parametrize("name", ["bench-clip-resnet50", "bench-clip-resnet50-own-plans", "bench-bf16-resnet50",
                                  "bench-bf16-transformer", "bench-ps-resnet50-uncompressed", "bench-bf16-ps-resnet50"])
def test_the_clipping_and_compression_tables_of_the_runtime_docs_are_what_their_json_prints(name):
    assert script("bench_table").table(figure(name)) in (ROOT / "docs" / "runtime.md").read_text()


@pytest.mark.parametrize("name", ["bench-4workers-resnet50", "bench-4workers-ps-resnet50", "bench-8workers-resnet50",
                                  "dataplane-before-sweep", "dataplane-after-sweep", "bench-vgg16-balance-jumbo",
                                  "bench-vgg16-balance-jumbo-k3", "bench-resnet50-balance-jumbo-k3",
                                  "bench-ps-resnet50-jumbo-k3", "bench-transformer-jumbo-k3",
                                  "bench-ps-resnet50-direction-k3", "bench-ps-resnet50-pieces-k3",
                                  "bench-bytescheduler-original-k3", "bench-bytescheduler-amortise-k3",
                                  "bench-sharded-resnet50-k3", "bench-sharded-vgg16-k3",
                                  "bench-sharded-resnet50-sweep-k3", "bench-sharded-resnet50-k3-inplace"])
def test_the_bench_docs_tables_are_what_their_json_prints(name):
    assert script("bench_table").table(figure(name)) in (ROOT / "docs" / "bench.md").read_text()


def test_the_readme_overhead_table_is_what_its_json_prints():
    assert script("runtime_overhead").table(figure("runtime-overhead")) in README
    assert script("runtime_overhead").table(figure("runtime-overhead-handoff")) in README
    assert script("runtime_overhead").table(figure("runtime-overhead-compile")) in README


def test_the_online_tuning_table_is_what_its_json_prints():
    runs = [("ResNet-50", figure("tune-online-resnet50")),
            ("ResNet-50 ({ddp}), poor start, no fallback", figure("tune-online-resnet50-poor-start")),
            ("Transformer", figure("tune-online-transformer"))]
    assert script("bench_table").tuning_summary(runs) in (ROOT / "docs" / "tuning.md").read_text()



def test_the_conformance_figures_are_what_their_json_prints():
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "conformance"))  # the suite's modules import each other by name
    import run
    import selection

    report = figure("conformance")
    assert report["tests"] == [s.name for s in selection.SELECTED]
    assert run.headline(report) in " ".join(README.split())  # the README's sentence may wrap
    page = (ROOT / "docs" / "conformance.md").read_text()
    assert run.summary(report) in page and run.exclusions() in page


def test_the_demos_figures_are_what_its_json_says():
    """The README's account of make demo's measured part (one run, dilated K=3)."""
    demo = figure("demo-resnet50-k3")
    rows = {r["policy"]: r for r in demo["results"]}
    ddp, prophet = rows["ddp"], rows["prophet"]
    text = " ".join(README.split())
    assert demo["dilation"] == 3.0 and "time-dilated K=3" in text
    said = (f"prophet {prophet['ratio_to_bound']:.2f}x the bound and {prophet['speedup_vs_ddp']:.2f}x faster than DDP "
            f"(DDP {ddp['ratio_to_bound']:.2f}x), predicted {prophet['predicted_s'] / prophet['iteration_s'] - 1:.0%} "
            f"slower than measured, the host {prophet['host_cpu_busy']:.0%} busy")
    assert said in text


def test_the_sharded_simulation_table_is_what_its_json_prints():
    assert script("sharded_table").table(figure("sharded-sim")) in (ROOT / "docs" / "simulator.md").read_text()
