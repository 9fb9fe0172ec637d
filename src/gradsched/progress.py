"""Progress of long command-line work (simulation sweeps, tuning trials, benchmark phases):
on a terminal, a tqdm bar with the count, rate and time left; otherwise, or without tqdm
(the ``progress`` extra), one plain line per item. Always on standard error."""

from __future__ import annotations

import sys
from typing import TextIO

from .extras import optional


class Progress:
    """Call it with the label of each item as it starts; close it (or use ``with``) at the end.

    ``lines``: print plain lines where there is no bar (False: stay silent there)."""

    def __init__(self, what: str, total: int | None = None, lines: bool = True,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.what = what
        self.total = total
        self.count = 0
        self.lines = lines
        tqdm = optional("tqdm")
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = tqdm.tqdm(total=total, desc=what, file=self.stream, leave=False, dynamic_ncols=True,
                             unit="step") if tqdm and tty else None

    def __call__(self, label: str) -> None:
        if self.bar is not None:
            if self.count:
                self.bar.update(1)
            self.bar.set_postfix_str(label)
        elif self.lines:
            of = f" [{self.count + 1}/{self.total}]" if self.total else ""
            print(f"{self.what}{of}: {label}", file=self.stream, flush=True)
        self.count += 1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(1 if self.count else 0)
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
