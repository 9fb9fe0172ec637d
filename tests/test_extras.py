"""``pip install gradsched`` needs only torch: with every optional package made unimportable,
the simulator, the CLI and the runtime work, and each feature that needs an extra says, in
one line, which ``pip install`` provides it. Progress is a tqdm bar on a terminal and plain
lines otherwise."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from gradsched.progress import Progress

OPTIONAL = ["matplotlib", "optuna", "scipy", "psutil", "tqdm", "lightning", "accelerate", "transformers"]

SCRIPT = """
import sys
for name in {optional!r}:
    sys.modules[name] = None  # as if not installed
import contextlib, io, tempfile
import torch, torch.distributed as dist
import gradsched
from gradsched.cli import main

def cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    return code, err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""

setting = ["--model", "resnet50", "--workers", "4", "--bandwidth", "10Gbit"]
assert cli("simulate", *setting) == (0, ""), cli("simulate", *setting)
print("plot", cli("simulate", *setting, "--plot", tempfile.mktemp(suffix=".png")))
print("tune", cli("tune", *setting, "--policy", "bytescheduler", "--trials", "2"))
print("bench", cli("bench", "--loopback", "--model", "replay-mini", "--iters", "3", "--policy", "ddp"))
for integration in ("lightning", "accelerate"):
    try:
        __import__("gradsched.integrations." + integration)
    except ImportError as exc:
        print(integration, str(exc))

dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    gradsched.wrap(model, optimizer, autotune=True)
except ImportError as exc:
    print("autotune", str(exc))
model, optimizer = gradsched.wrap(model, optimizer, "prophet")
for _ in range(3):
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
optimizer.close()
print("trained")
"""


def test_only_torch_is_needed_and_each_extra_is_named_when_missing():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT.format(optional=OPTIONAL))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = {feature: text for feature, _, text in (line.partition(" ") for line in out.stdout.splitlines())}
    for feature, extra in [("plot", "plot"), ("tune", "tune"), ("bench", "bench"), ("lightning", "lightning"),
                           ("accelerate", "accelerate"), ("autotune", "tune")]:
        assert f"pip install 'gradsched[{extra}]'" in said[feature], (feature, said[feature])
    assert "trained" in said  # wrap, with no optional package


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_otherwise():
    plain = io.StringIO()
    with Progress("bench", 3, stream=plain) as progress:
        for label in ("ddp", "prophet", "compute only"):
            progress(label)
    assert plain.getvalue().splitlines() == ["bench [1/3]: ddp", "bench [2/3]: prophet", "bench [3/3]: compute only"]
    quiet = io.StringIO()
    with Progress("simulating", 2, lines=False, stream=quiet) as progress:
        progress("fifo")
    assert quiet.getvalue() == ""
    terminal = Terminal()
    with Progress("tuning", 4, stream=terminal) as progress:
        progress("best 3.00 ms")
        progress("best 2.50 ms")
    drawn = terminal.getvalue()
    assert "tuning" in drawn and "/4" in drawn and "best 2.50 ms" in drawn and "step/s" in drawn
