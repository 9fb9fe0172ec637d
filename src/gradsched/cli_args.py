"""Command-line pieces every ``gradsched`` command shares: one-line usage errors, lists,
bandwidths and ``--set POLICY.OPTION=VALUE``.

>>> parse_sets(["prophet.fuse_bytes=8MiB"], ["ddp", "prophet"])
[('prophet', 'fuse_bytes', '8MiB')]
>>> parse_sets(["fuse_bytes=8MiB"], ["prophet"])
Traceback (most recent call last):
...
gradsched.cli_args.UsageError: --set 'fuse_bytes=8MiB': write POLICY.OPTION=VALUE, e.g. bytescheduler.credit_bytes=8MiB
"""

from __future__ import annotations

import argparse
from typing import Sequence

from .units import parse_bandwidth


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(f"{message} (see '{self.prog} --help')")


def split_list(text: str, what: str = "list") -> list[str]:
    """Items of a comma list; an empty item is an error."""
    items = [s.strip() for s in text.split(",")]
    if not all(items):
        raise UsageError(f"empty item in {what} {text!r}")
    return items


def bandwidths(single: str | None, sweep: str | None, default: str) -> list[float]:
    """Bits per second from ``--bandwidth`` or ``--sweep-bandwidth`` (bare numbers: Gbit/s)."""
    if single and sweep:
        raise UsageError("use either --bandwidth or --sweep-bandwidth, not both")
    texts = split_list(sweep, "--sweep-bandwidth") if sweep else [single or default]
    return [parse_bandwidth(t) for t in texts]


def parse_sets(items: Sequence[str], policies: Sequence[str]) -> list[tuple[str, str, str]]:
    """``--set POLICY.OPTION=VALUE`` items as (policy, option, value); the policy must be one
    of ``policies``. Values are parsed (and checked) by the policy's configuration."""
    parsed = []
    for item in items:
        key, eq, value = item.partition("=")
        policy, dot, option = key.partition(".")
        if not (eq and dot and option.strip()):
            raise UsageError(f"--set {item!r}: write POLICY.OPTION=VALUE, e.g. bytescheduler.credit_bytes=8MiB")
        if policy.strip() not in policies:
            raise UsageError(f"--set {item!r}: policy {policy.strip()!r} is not in --policy {','.join(policies)}")
        parsed.append((policy.strip(), option.strip(), value.strip()))
    return parsed
