"""The docs can be checked: every measured table in the README and under docs/ is exactly what a
script in benchmarks/ prints from the JSON committed under docs/figures, wherever the table
lives; no table is there that no JSON prints; docs/bench.md gives each result its command,
date and commit, newest first; and every link and quoted section between the pages exists."""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib.util
import io
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = {"README.md": README, "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text(),
         **{f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}}

# bench JSON whose figures the pages quote in their prose instead of a table (each must still be named)
PROSE_ONLY = {"bench-mtu1500-resnet50", "bench-mtu65000-resnet50", "bench-sharded-resnet50-k3-run1",
              "bench-sharded-resnet50-k3-run2", "bench-sharded-resnet50-k3-run3", "redesign-before-sweep",
              "redesign-before-sweep2", "redesign-after-sweep", "redesign-after-sweep2",
              # shown otherwise: the README's demo sentence, the online tuning summary (each checked below)
              "demo-resnet50-k3", "tune-online-resnet50", "tune-online-resnet50-poor-start", "tune-online-transformer"}
# runs that led to bytescheduler's derived sizes, each named in docs/bench.md's prose by its figure
PROSE_ONLY_RUNS = ("bench-bs-window15-*", "bench-bs-k1-*", "bench-bs-fixed-*", "bench-bs-estimate-*", "bench-bs-noisy-*")


def prose_only(name: str) -> bool:
    return name in PROSE_ONLY or any(fnmatch.fnmatch(name, pattern) for pattern in PROSE_ONLY_RUNS)
# the scaling tables of docs/bench.md (benchmarks/scaling.py): each model's runs, one per worker count at its
# balance point, and the counts predicted only
SCALING = {("bench-straggler-none-resnet50-k3", "bench-scaling-resnet50-4w-k7", "bench-scaling-resnet50-8w-k20"): [16],
           ("bench-bs-derived-vgg16-b96-k3", "bench-scaling-vgg16-4w-k7"): [8, 16],
           ("bench-bs-derived-vgg16-b96-k3", "bench-scaling-vgg16-4w-k7", "bench-scaling-vgg16-8w-k13"): [16],
           ("bench-bs-derived-transformer-b96-k3", "bench-scaling-transformer-4w-k12"): [8, 16]}
BENCH_TITLE = re.compile(r"^\*\*[\w-]+\*\*, \d+ workers", re.M)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # (a script's dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def figure(name: str) -> dict:
    return json.loads((DOCS / "figures" / f"{name}.json").read_text())


def bench_figures() -> list[str]:
    """Every committed output of ``gradsched bench --json``."""
    names = []
    for path in sorted((DOCS / "figures").glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and {"model", "settings", "results"} <= data.keys():
            names.append(path.stem)
    return names


@functools.cache
def rendered_bench_tables() -> dict[str, str]:  # read once, shared by every page's check
    table = script("bench_table").table
    return {name: table(figure(name)) for name in bench_figures() if not prose_only(name)}


def bench_tables_in(text: str) -> list[str]:
    """Each bench table of a page: its title line to its last row."""
    found = []
    for match in BENCH_TITLE.finditer(text):
        lines = text[match.start():].splitlines()
        end = 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        found.append("\n".join(lines[:end]))
    return found


def test_every_bench_figure_is_shown_or_named_somewhere():
    assert len(bench_figures()) > 30
    everything = "\n".join(PAGES.values())
    missing = [name for name, table in rendered_bench_tables().items() if table not in everything]
    assert missing == [], f"no page shows the table of {missing}"
    named = set()
    for pattern in re.findall(r"figures/([\w.{},*-]+)\.json", everything):  # -run1.json, {a,b}, * as the pages write them
        head, _, rest = pattern.partition("{")
        choices, _, tail = rest.partition("}")
        named |= {head + c + tail for c in choices.split(",")} if rest else {pattern}
    prose = sorted(PROSE_ONLY | {name for name in bench_figures() if prose_only(name)})
    unnamed = [name for name in prose if not any(fnmatch.fnmatch(name, n) for n in named)]
    assert unnamed == [], f"no page names {unnamed}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_bench_table_of_a_page_is_what_a_json_prints(page):
    rendered = list(rendered_bench_tables().values())
    stale = [t.splitlines()[0] for t in bench_tables_in(PAGES[page]) if not any(t in r for r in rendered)]
    assert stale == [], f"{page}: tables no committed JSON prints: {stale}"


def test_the_readme_is_a_front_page_with_the_headline_table():
    assert len(README.splitlines()) < 150
    headline = script("bench_table").headline()
    assert headline in README
    assert "time-dilated K=3" in headline and "| VGG-16, 2 workers |" in headline
    assert bench_tables_in(README) == []  # the measured tables live in docs/bench.md


def test_the_overhead_and_cpu_cost_tables_are_what_their_json_prints():
    overhead = script("runtime_overhead").table
    shown = {name: overhead(figure(name)) for name in ("runtime-overhead", "runtime-overhead-handoff",
                                                         "runtime-overhead-compile")}
    cpu_cost = script("cpu_cost").table
    shown.update({name: cpu_cost(figure(name)) for name in (
        *(f"cpu-cost-{model}-h100{plans}{after}" for model in ("resnet50", "transformer") for plans in ("", "-plans")
          for after in ("", "-after")),
        "cpu-cost-resnet50-h100-plans-launch30", "cpu-cost-transformer-h100-plans-launch30",
        "cpu-cost-transformer-h100-plans-copies",
        *(f"cpu-cost-{model}-h100-plans-quiet{n}" for model in ("resnet50", "transformer") for n in (1, 2)))})
    for name, table in shown.items():
        assert table in PAGES["docs/bench.md"], name
    for page, text in PAGES.items():  # and no other loopback table is shown anywhere
        for block in re.findall(r"```\n(2 ranks, loopback.*?)```", text, re.S):
            assert block in shown.values(), f"{page}: a loopback table no committed JSON prints"


def test_the_buffer_broadcast_tables_are_what_their_json_prints():
    broadcast = script("buffer_broadcast").table
    for name in ("buffer-broadcast-before", "buffer-broadcast"):
        assert broadcast(figure(name)) in PAGES["docs/bench.md"], name


def test_the_gpu_figures_in_the_pages_are_what_the_gpu_run_wrote():
    """docs/cuda.md, "On the GPU, 2026-12-04": the rows of the one run on a GPU and its profile."""
    check, profile = figure("gpu-check"), figure("gpu-profile")
    page = " ".join(PAGES["docs/cuda.md"].split())
    rows = {r["check"]: r for r in check["rows"]}
    assert check["setting"]["torch"] in page and check["setting"]["device"].split()[-1] in page
    passed = [r for r in check["rows"] if r["ok"] is True]
    assert f"its {len(passed)} correctness rows passed" in " ".join(PAGES["docs/guide.md"].split())
    assert all(r["check"].split()[0] in ("steady", "overlap", "overhead") for r in check["rows"] if r["ok"] is False)
    for policy in ("fifo", "priority", "bytescheduler", "prophet"):
        r = rows[f"overhead {policy}"]
        assert f"{policy} {r['iteration_s'] * 1e3:.1f} (" in page, policy
    assert f"DDP {rows['overhead ddp']['iteration_s'] * 1e3:.1f}" in page
    steady = rows["steady no drain: a barrier-crossing policy against fifo"]
    assert f"bytescheduler {steady['bytescheduler_s'] * 1e3:.1f}" in page and f"fifo {steady['fifo_s'] * 1e3:.1f}" in page
    compute = profile["link-ddp"]["compute_ms"]
    for name in ("link-fifo", "link-bytescheduler"):
        drained = sorted(profile[name]["delayed_drained_ms"][3:])[len(profile[name]["delayed_drained_ms"][3:]) // 2]
        hidden = 1 - (drained - compute) / (0.5 * compute)
        assert f"{drained:.1f}" in page and f"{hidden:.0%}" in page, name


def test_the_gpu_rerun_after_the_ownership_change_is_what_it_wrote():
    """docs/cuda.md: the correctness parts run again on the GPU after issue 56."""
    check = figure("gpu-check-issue56")
    page = " ".join(PAGES["docs/cuda.md"].split())
    rows = {r["check"]: r for r in check["rows"]}
    judged = [r for r in check["rows"] if r["ok"] is not None]
    assert all(r["ok"] for r in judged) and f"all {len(judged)} judged rows passed" in page
    assert f"{check['setting']['seconds']:.0f} s, `docs/figures/gpu-check-issue56.json`" in page
    profile = rows["profile a sleeping layer"]
    assert f"{20 * profile['forward_ratio']:.1f}/{40 * profile['backward_ratio']:.1f} ms" in page
    syncs = rows["host_syncs on the training thread per iteration"]
    assert f"{syncs['gradsched']} times an iteration (DDP {syncs['ddp']})" in page
    calls = rows["host_syncs gradsched's Python calls per iteration"]["calls"]
    assert f"{calls:.0f} calls" in page


def test_the_online_tuning_table_is_what_its_json_prints():
    runs = [("ResNet-50", figure("tune-online-resnet50")),
            ("ResNet-50 ({ddp}), poor start, no fallback", figure("tune-online-resnet50-poor-start")),
            ("Transformer", figure("tune-online-transformer"))]
    assert script("bench_table").tuning_summary(runs) in PAGES["docs/bench.md"]


def test_the_conformance_figures_are_what_their_json_prints():
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "conformance"))  # the suite's modules import each other by name
    import run
    import selection

    report = figure("conformance")
    assert report["tests"] == [s.name for s in selection.SELECTED]
    assert run.headline(report) in " ".join(README.split())  # the README's sentence may wrap
    page = PAGES["docs/conformance.md"]
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


def test_the_memory_table_is_what_its_json_prints():
    assert script("memory_table").table(figure("memory")) in PAGES["docs/memory.md"]


def test_the_simulators_figures_are_what_their_json_prints():
    page = PAGES["docs/simulator.md"]
    assert script("sharded_table").table(figure("sharded-sim")) in page
    assert script("sweep_table").tables(figure("sim-sweep")) in page
    grid = figure("sim-policy-grid")
    summary = script("policy_grid").summary(grid["cases"], grid["policy"])
    assert "\n".join("  " + line for line in summary.splitlines()) in page


def test_the_bytescheduler_sizes_summary_is_what_its_json_prints():
    rows = figure("sim-bytescheduler-sizes")["rows"]
    summary = script("bytescheduler_sizes").table(rows).splitlines()[-1]
    assert summary in PAGES["docs/policies.md"]


def test_the_simulate_example_is_what_the_command_prints():
    from gradsched.cli import main

    page = PAGES["docs/simulator.md"]
    command = "simulate --model resnet50 --workers 16 --bandwidth 10Gbit --arch allreduce --policy fifo,priority,bytescheduler,prophet"
    assert f"gradsched {command}" in " ".join(page.split())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(command.split()) in (0, None)
    assert out.getvalue() in page


@pytest.mark.slow
def test_the_simulators_json_is_what_a_fresh_simulation_gives():
    sweep = figure("sim-sweep")
    entries = sweep["sweeps"]
    fresh = script("sweep_table").sweep(list(dict.fromkeys(e["model"] for e in entries)),
                                        list(dict.fromkeys(e["arch"] for e in entries)), entries[0]["workers"],
                                        [s["bandwidth_gbps"] for s in entries[0]["settings"]], sweep["iterations"])
    assert json.loads(json.dumps(fresh)) == sweep
    grid = figure("sim-policy-grid")
    cases = grid["cases"]
    again = script("policy_grid").grid(list(dict.fromkeys(c["model"] for c in cases)),
                                       list(dict.fromkeys(c["workers"] for c in cases)),
                                       list(dict.fromkeys(c["arch"] for c in cases)),
                                       list(dict.fromkeys(c["gbps"] for c in cases)), grid["policy"],
                                       latency_s=grid["latency_s"], overhead_s=grid["overhead_s"])
    assert json.loads(json.dumps(again)) == cases


ENTRY = re.compile(r"^### .*\((\d{4}-\d{2}-\d{2}), commits? ([0-9a-f]{7})", re.M)


def bench_entries(section: str) -> list[tuple[str, str]]:
    """(heading, text) of every entry of a section of docs/bench.md."""
    page = PAGES["docs/bench.md"]
    start = page.index(f"\n## {section}\n")
    end = page.find("\n## ", start + 1)
    body = page[start:end if end > 0 else None]
    parts = re.split(r"^(### .*)$", body, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def test_bench_results_are_newest_first_each_with_its_command_date_and_commit():
    page = PAGES["docs/bench.md"]
    for section in ("Results, newest first", "Superseded"):
        entries = bench_entries(section)
        assert len(entries) >= 4
        dates = []
        for heading, text in entries:
            match = ENTRY.match(heading)
            assert match, f"{heading!r} has no (date, commit)"
            dates.append(match.group(1))
            assert re.search(r"^(gradsched bench|python benchmarks/)", text, re.M), f"{heading}: no command"
        if section.startswith("Results"):
            assert dates == sorted(dates, reverse=True), "results are not newest first"
    first_entry = page.index("\n## Results, newest first\n")
    assert bench_tables_in(page[:first_entry]) == [], "a measured table outside the results"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    return [h.strip() for h in re.findall(r"^#{1,4} (.*)$", text, re.M)]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_link_between_the_pages_exists(page):
    base = (ROOT / page).parent
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", PAGES[page]):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        where = (base / path).resolve() if path else ROOT / page
        if not where.exists():
            broken.append(target)
        elif anchor and anchor not in {slug(h) for h in headings(where.read_text())}:
            broken.append(target)
    assert broken == [], f"{page}: broken links {broken}"


SECTION_REF = re.compile(r"(?:docs/)?([\w-]+\.md)(?:\]\([^)]*\))?,? \"([^\"]+)\"")


def test_every_quoted_section_of_a_page_exists():
    """`docs/guide.md, "Clipping"` and the like, in the pages, the source, the tests and the scripts."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.glob("*.md"), *(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "examples").glob("*.py")]
    wrong = []
    for path in files:
        text = " ".join(re.sub(r"\n\s*#\s?", "\n", path.read_text()).split())  # comments and wrapped lines as one line
        for name, section in SECTION_REF.findall(text):
            target = ROOT / name if name == "README.md" else DOCS / name
            if not target.exists():
                continue
            page = target.read_text()
            flat = " ".join(page.split())
            if not any(h.startswith(section) for h in headings(page)) and f"**{section}" not in flat:
                wrong.append(f"{path.relative_to(ROOT)}: {name} \"{section}\"")
    assert wrong == [], "quoted sections that do not exist:\n" + "\n".join(wrong)


def test_the_user_guide_and_the_internals_stay_short_and_the_index_names_every_page():
    for page in ("docs/guide.md", "docs/internals.md"):
        assert len(PAGES[page].splitlines()) <= 350, page
    index = PAGES["docs/index.md"]
    unlisted = [p for p in PAGES if p.startswith("docs/") and p != "docs/index.md" and f"]({p[5:]})" not in index]
    assert unlisted == [], f"docs/index.md does not list {unlisted}"


def test_the_scaling_table_is_what_its_json_prints():
    scaling = script("scaling")
    for names, extra in SCALING.items():
        runs = [str(DOCS / "figures" / f"{name}.json") for name in names]
        assert scaling.table(scaling.points(runs, batch=96, extra=extra)) in PAGES["docs/bench.md"], names


def test_the_cpu_trial_table_is_what_its_json_prints():
    assert script("cpu_trial").table(figure("cpu-trial")["runs"]) in PAGES["docs/bench.md"]


def test_every_repeated_runs_table_is_what_its_json_prints():
    names = sorted(p.stem for p in (DOCS / "figures").glob("repeat-*.json"))
    assert names, "no repeated runs committed"
    table = script("repeated_runs").table
    missing = [name for name in names if table(figure(name)) not in PAGES["docs/bench.md"]]
    assert missing == [], f"docs/bench.md does not show the tables of {missing}"
