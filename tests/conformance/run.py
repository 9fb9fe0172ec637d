"""Run the selected PyTorch DDP tests against gradsched (every policy) and against PyTorch's DDP.

    python tests/conformance/run.py                                  # gradsched, default policy
    python tests/conformance/run.py --policy all --reference --mutant --json docs/figures/conformance.json
    python tests/conformance/run.py --table docs/figures/conformance.json   # what docs/conformance.md shows

Each (target, policy) runs in one child process, ``python -m unittest``-style, in which every
test spawns its own two gloo ranks (upstream's ``MultiProcessTestCase``); a test that hangs is
ended by upstream's own per-test timeout (``--test-timeout``, default 90 s) and counts as failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICIES = ("fifo", "priority", "bytescheduler", "prophet")
DEFAULT_POLICY = "bytescheduler"


MUTANT = "mutant"  # the target gradsched that never reduces (tests/mutant)
MUTANT_LABEL = "gradsched, no reduction (mutant)"


def child_env(target: str, policy: str | None, test_timeout: int) -> dict[str, str]:
    path = [str(HERE)] + ([str(HERE.parent / "mutant")] if target == MUTANT else []) + \
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # a source tree named there is kept
    env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2",
               GRADSCHED_CONFORMANCE_TARGET="gradsched" if target == MUTANT else target,
               OMP_NUM_THREADS="1",  # one intra-op thread per rank: sums in a fixed order
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(test_timeout), PYTHONPATH=os.pathsep.join(path))
    env.pop("GRADSCHED_POLICY", None)
    env.pop("GRADSCHED_MUTANT", None)
    if target == MUTANT:
        env["GRADSCHED_MUTANT"] = "no-reduction"
    for name in ("SANDCASTLE", "TW_JOB_USER"):  # upstream's skips turn into passes under these
        env.pop(name, None)
    if policy is not None:
        env["GRADSCHED_POLICY"] = policy
    return env


def run_tests(names: list[str], target: str, policy: str | None, test_timeout: int = 90) -> dict[str, dict]:
    """Outcome of each test: ``{"outcome": "passed"|"failed"|"skipped", "detail": str, "seconds": float}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "outcomes.json"
        cmd = [sys.executable, str(HERE / "run.py"), "--child", str(out), *names]
        budget = 60 + len(names) * (test_timeout + 15)
        proc = subprocess.run(cmd, env=child_env(target, policy, test_timeout), cwd=HERE, timeout=budget,
                              capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"the conformance child ended without results (status {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
        return json.loads(out.read_text())


class _Recording(unittest.TextTestResult):
    """Keeps each test's outcome, with the first lines of the reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        self.outcomes[test._testMethodName] = {"outcome": outcome, "detail": detail[-3000:],
                                              "seconds": round(time.monotonic() - self._started, 1)}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def _child(out: Path, names: list[str]) -> None:
    import suite  # the ported copy is generated and imported here (and again in every rank)

    tests = unittest.TestSuite(suite.Conformance(name) for name in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Recording)
    result = runner.run(tests)
    out.write_text(json.dumps(result.outcomes, indent=1))


def main(argv: list[str] | None = None) -> int:
    from selection import SELECTED

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", nargs="*", help="test names (default: the whole selection)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="comma-separated policies, or 'all'")
    parser.add_argument("--reference", action="store_true", help="also run PyTorch's own DDP")
    parser.add_argument("--mutant", action="store_true",
                        help="also run a gradsched that never reduces (the default policy): what the tests guard")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--table", type=Path, help="print the summary of a JSON written before, and stop")
    parser.add_argument("--test-timeout", type=int, default=90, help="seconds before a test counts as hung")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.tests)
        return 0
    if args.table:
        report = json.loads(args.table.read_text())
        print(headline(report), summary(report), exclusions(), sep="\n\n")
        return 0
    names = args.tests or [s.name for s in SELECTED]
    unknown = sorted(set(names) - {s.name for s in SELECTED})
    if unknown:
        parser.error(f"not in the selection (tests/conformance/selection.py): {', '.join(unknown)}")
    policies = list(POLICIES) if args.policy == "all" else args.policy.split(",")
    bad = sorted(set(policies) - set(POLICIES))
    if bad:
        parser.error(f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICIES)} or 'all'")
    runs = (([("torch", None)] if args.reference else []) + [("gradsched", p) for p in policies]
            + ([(MUTANT, DEFAULT_POLICY)] if args.mutant else []))
    import torch

    report = {"torch": torch.__version__, "tests": names, "runs": {}}
    for target, policy in runs:
        label = {"torch": "torch DDP", MUTANT: MUTANT_LABEL}.get(target, f"gradsched {policy}")
        started = time.monotonic()
        print(f"{label}: {len(names)} tests ...", flush=True)
        report["runs"][label] = run_tests(names, target, policy, args.test_timeout)
        print(f"  {time.monotonic() - started:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(headline(report), summary(report), sep="\n\n")
    failed = [n for label, outcomes in report["runs"].items() if label not in ("torch DDP", MUTANT_LABEL)
              for n in names if outcomes.get(n, {}).get("outcome") != "passed"]
    return 1 if failed else 0


def summary(report: dict) -> str:
    """The markdown table of every outcome: one row per test, one column per run."""
    from selection import SELECTED

    ported = {s.name for s in SELECTED if s.ported}
    labels = list(report["runs"])
    lines = ["| test | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name in report["tests"]:
        cells = [report["runs"][label].get(name, {}).get("outcome", "missing") for label in labels]
        lines.append(f"| `{name}`{' (ported)' if name in ported else ''} | " + " | ".join(cells) + " |")
    total = len(report["tests"])
    lines.append("| **passed** | " + " | ".join(f"**{_passed(report, label)} of {total}**" for label in labels) + " |")
    return "\n".join(lines)


def headline(report: dict) -> str:
    """The one sentence the README gives the suite."""
    from selection import EXCLUDED

    total = len(report["tests"])
    ours = [label for label in report["runs"] if label not in ("torch DDP", MUTANT_LABEL)]
    counts = {_passed(report, label) for label in ours}
    reference = (f"PyTorch's DDP passes {_passed(report, 'torch DDP')} of them here; "
                 if "torch DDP" in report["runs"] else "")
    if len(counts) == 1:
        ours_text = f"gradsched passes {counts.pop()} under each of its {len(ours)} policies"
    else:
        ours_text = "gradsched passes " + ", ".join(f"{_passed(report, l)} ({l})" for l in ours)
    mutant = ""
    if MUTANT_LABEL in report["runs"]:
        mutant = (f" Against a gradsched that never reduces (each rank's all-reduce hands back its own gradients), "
                  f"{_passed(report, MUTANT_LABEL)} of them still pass: those guard the rest of the contract, not the "
                  "reduction, which the project's own equality tests guard (tests/distributed/test_mutant.py: "
                  "they fail on it).")
    return (f"{total} of PyTorch {report['torch']}'s own DDP tests run against gradsched ({len(EXCLUDED)} more "
            f"that construct a DDP are excluded, each with its reason): {reference}{ours_text}.{mutant}")


def exclusions() -> str:
    """The markdown list of the excluded tests, grouped by reason."""
    from selection import EXCLUDED

    by_reason: dict[str, list[str]] = {}
    for e in EXCLUDED:
        by_reason.setdefault(e.why, []).append(e.name)
    return "\n".join(f"- {why[0].upper()}{why[1:]}: " + ", ".join(f"`{n}`" for n in names)
                     for why, names in by_reason.items())


def _passed(report: dict, label: str) -> int:
    return sum(o.get("outcome") == "passed" for o in report["runs"][label].values())


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
