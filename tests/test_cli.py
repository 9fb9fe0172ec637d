"""The gradsched command line, run in-process (and once as a real console script)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gradsched.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_one_object_with_the_documented_fields(capsys):
    code, out, err = run(capsys, "simulate", "--model", "resnet50", "--workers", "8", "--sweep-bandwidth", "2,10",
                         "--policy", "fifo,bytescheduler,prophet", "--iterations", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"] == "resnet50" and data["workers"] == 8
    results = data["results"]
    assert [(r["policy"], r["bandwidth_gbps"]) for r in results] == [
        (p, b) for b in (2.0, 10.0) for p in ("fifo", "bytescheduler", "prophet")
    ]
    for r in results:
        assert {"policy", "bandwidth_gbps", "iteration_s", "bound_s", "speedup_vs_fifo"} <= set(r)
        assert r["iteration_s"] >= r["bound_s"] * (1 - 1e-9)
        assert r["speedup_vs_fifo"] == pytest.approx(
            next(x["iteration_s"] for x in results if x["policy"] == "fifo" and x["bandwidth_gbps"] == r["bandwidth_gbps"])
            / r["iteration_s"]
        )


def test_table_output_and_speedup_without_fifo_row(capsys):
    code, out, _ = run(capsys, "simulate", "--model", "resnet50", "--bandwidth", "5Gbit", "--arch", "ps",
                       "--servers", "4", "--policy", "bytescheduler", "--iterations", "6")
    assert code == 0
    assert "ps (4 servers)" in out and "5 Gbit/s" in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith("bytescheduler")]
    assert len(lines) == 1 and lines[0][4].endswith("x") and float(lines[0][4][:-1]) > 1.0
    assert not any(line.strip().startswith("fifo") for line in out.splitlines())


@pytest.mark.parametrize("compression", [[], ["--compression", "bf16", "--cast-cost", "0.2ns"]])
def test_trace_is_valid_chrome_json_without_overlaps_per_track(capsys, tmp_path, compression):
    trace = tmp_path / "t.json"
    code, _, err = run(capsys, "simulate", "--model", "resnet50", "--policy", "fifo,prophet", "--iterations", "6",
                       "--arch", "ps", "--trace", str(trace), *compression)
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {n for n in names.values()} >= {"compute", "push (bytes on the wire)", "pull (bytes on the wire)", "in flight 0"}
    casts = {"cast (to and from the wire dtype)", "cast back (to and from the wire dtype)"}
    assert casts <= set(names.values()) if compression else not casts & set(names.values())
    tracks: dict = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    assert {pid for pid, _ in tracks} == {0, 1}
    for spans in tracks.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-6 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_fully_sharded_is_simulated_per_policy_with_the_gathers_on_the_link_track(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, out, err = run(capsys, "simulate", "--model", "resnet50", "--bandwidth", "3Gbit", "--workers", "2",
                         "--arch", "fully_sharded", "--policy", "fifo,bytescheduler,prophet", "--iterations", "8",
                         "--json", "--trace", str(trace))
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [r["policy"] for r in results] == ["fifo", "bytescheduler", "prophet"]
    # a fully sharded rank moves half again an all-reduce's bytes (a gather before each forward
    # and backward, a reduce-scatter after): the link is busy for more than the bound's communication
    for r in results:
        assert r["iteration_s"] * r["link_utilisation"] > 1.4 * r["bound_s"]
    events = json.loads(trace.read_text())["traceEvents"]
    wire = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"
            and e["args"]["name"] == "link (bytes on the wire)"}
    assert len(wire) == 3  # one per policy
    for track in wire:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) == track)
        assert len(spans) > 1000  # the gathers: one per layer with parameters, twice an iteration
        assert all(a_end <= b_start + 1e-6 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_the_budgets_reach_the_simulation(capsys):
    """A gather budget that holds VGG-16 whole gathers it once, after the step, as sharded does; a
    gradient budget of one convolution's gradients holds the backward pass back."""
    def seconds(*argv):
        code, out, err = run(capsys, "simulate", "--model", "vgg16", "--workers", "2", "--bandwidth", "5Gbit",
                             "--policy", "prophet", "--iterations", "8", "--json", *argv)
        assert code == 0, err
        return json.loads(out)["results"][0]["iteration_s"]

    whole = seconds("--arch", "fully_sharded", "--gather-budget", "1GiB", "--gradient-budget", "inf")
    assert whole == pytest.approx(seconds("--arch", "sharded", "--gradient-budget", "inf"))
    assert seconds("--arch", "fully_sharded") > 1.2 * whole
    assert seconds("--arch", "sharded", "--gradient-budget", "4MiB") > 1.05 * whole


def test_plots_are_written(capsys, tmp_path):
    for extra in (["--bandwidth", "10Gbit"], ["--sweep-bandwidth", "5,50"]):
        png = tmp_path / f"p{len(extra[1])}.png"
        code, out, err = run(capsys, "simulate", "--model", "resnet50", "--iterations", "6", "--plot", str(png), *extra)
        assert code == 0, err
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_set_changes_a_policy_option(capsys):
    base = json.loads(run(capsys, "simulate", "--policy", "bytescheduler", "--iterations", "6", "--json")[1])
    changed = json.loads(run(capsys, "simulate", "--policy", "bytescheduler", "--iterations", "6", "--json",
                             "--set", "bytescheduler.credit_bytes=64MiB")[1])
    config = base["results"][0]["config"]
    assert config["credit_bytes"] == 3 * config["partition_bytes"] < 64 << 20  # derived from the link: 3 slices
    assert changed["results"][0]["config"]["credit_bytes"] == 64 << 20


def test_profile_round_trip(capsys, tmp_path):
    path = tmp_path / "r50.json"
    assert run(capsys, "profile", "--model", "resnet50", "--batch", "16", "--out", str(path))[0] == 0
    code, out, err = run(capsys, "simulate", "--profile", str(path), "--policy", "fifo", "--iterations", "6", "--json")
    assert code == 0, err
    assert json.loads(out)["table"]["batch"] == 16


def test_models_lists_everything(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for word in ("vgg16", "bert-large", "v100", "h100", "prophet", "credit_bytes"):
        assert word in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["simulate", "--model", "alexnet"], "unknown model 'alexnet'"),
        (["simulate", "--policy", "fifo,magic"], "unknown policy 'magic'"),
        (["simulate", "--bandwidth", "0Gbit"], "bandwidth must be > 0"),
        (["simulate", "--bandwidth=-3Gbit"], "invalid bandwidth"),
        (["simulate", "--bandwidth", "10Gbt"], "invalid bandwidth '10Gbt'"),
        (["simulate", "--latency", "50"], "invalid duration '50'"),
        (["simulate", "--sweep-bandwidth", "1,,2"], "empty item"),
        (["simulate", "--bandwidth", "1Gbit", "--sweep-bandwidth", "1,2"], "not both"),
        (["simulate", "--workers", "0"], "workers must be"),
        (["simulate", "--workers", "two"], "invalid int value"),
        (["simulate", "--servers", "2"], "--servers needs --arch ps"),
        (["simulate", "--arch", "ring"], "invalid choice"),
        (["simulate", "--gather-budget", "1MiB"], "--gather-budget needs --arch fully_sharded"),
        (["simulate", "--arch", "sharded", "--gather-budget", "1MiB"], "--gather-budget needs --arch fully_sharded"),
        (["simulate", "--gradient-budget", "inf"], "--gradient-budget needs --arch sharded or fully_sharded"),
        (["simulate", "--arch", "sharded", "--gradient-budget", "lots"], "--gradient-budget: invalid size 'lots'"),
        (["simulate", "--arch", "fully_sharded", "--gather-budget", "0"], "--gather-budget must be at least 1 byte"),
        (["simulate", "--sweep-bandwidth", "1,2", "--trace", "t.json"], "--trace needs a single bandwidth"),
        (["simulate", "--plot", "/no/such/dir/p.png"], "does not exist"),
        (["simulate", "--trace", "/"], "is a folder; give a file name"),
        (["bench", "--loopback", "--plot", "/no/such/dir/p.png"], "--plot /no/such/dir/p.png: folder"),
        (["simulate", "--set", "bytescheduler.credit=1"], "has no option 'credit'"),
        (["simulate", "--set", "credit=1"], "POLICY.OPTION=VALUE"),
        (["simulate", "--policy", "fifo", "--set", "prophet.stage_factor=3"], "not in --policy"),
        (["simulate", "--set", "bytescheduler.credit_bytes=lots"], "invalid size 'lots'"),
        (["simulate", "--iterations", "2"], "iterations must be >= 3"),
        (["simulate", "--profile", "/no/such.json"], "cannot read profile"),
        (["simulate", "--profile", "x.json", "--model", "vgg16"], "either --model or --profile"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradsched: error: ")
    assert message in lines[0]


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-0.5"])
def test_a_profile_with_impossible_times_is_refused(capsys, tmp_path, bad):
    profile = tmp_path / "p.json"
    profile.write_text('{"model": "m", "layers": [{"name": "a", "forward_s": %s, "backward_s": 0.001, '
                       '"params": [{"name": "a.w", "numel": 100}]}]}' % bad)
    code, out, err = run(capsys, "simulate", "--profile", str(profile))
    assert code == 2 and out == ""
    assert "compute times must be finite and >= 0" in err and len(err.strip().splitlines()) == 1


def test_malformed_profile_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "m", "layers": [{"name": "a"}]}')
    code, _, err = run(capsys, "simulate", "--profile", str(bad))
    assert code == 2 and "layers[0] is missing field" in err


def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "gradsched", "models"], capture_output=True, text=True, check=True)
    assert "resnet152" in out.stdout


def test_simulate_with_compression_halves_the_bytes_on_the_wire(capsys):
    from gradsched.cli import main

    setting = ["simulate", "--model", "resnet50", "--workers", "16", "--bandwidth", "10Gbit", "--json"]
    figures = {}
    for extra in ([], ["--compression", "bf16"]):
        assert main(setting + extra) == 0
        figures[bool(extra)] = json.loads(capsys.readouterr().out)["results"][0]
    assert figures[True]["comm_s"] == pytest.approx(figures[False]["comm_s"] / 2, rel=1e-9)
    assert figures[True]["compute_s"] == figures[False]["compute_s"]


def test_compression_casts_cost_what_the_device_preset_or_cast_cost_says(capsys):
    from gradsched.cli import main
    from gradsched.models import get_device

    setting = ["simulate", "--model", "resnet50", "--workers", "16", "--bandwidth", "10Gbit", "--policy", "fifo",
               "--compression", "bf16", "--json"]
    times = {}
    for extra in (["--cast-cost", "0"], [], ["--cast-cost", "1ns"]):
        assert main(setting + extra) == 0
        row = json.loads(capsys.readouterr().out)["results"][0]
        times[tuple(extra)] = row["iteration_s"]
    assert get_device("v100").cast_s_per_byte == pytest.approx(3 / 750e9)
    # fifo's last bucket is cast and cast back after the backward pass: never free
    assert times[("--cast-cost", "0")] < times[()] < times[("--cast-cost", "1ns")]
    assert main(setting[:-3] + ["--cast-cost", "1ns"]) == 2
    assert "--cast-cost needs --compression" in capsys.readouterr().err
