"""Checks, before any work is done, that an output file can be written where the user
asked, so that a long run never fails at its end (``--trace``, ``--plot``, ``wrap(trace=)``).

>>> problem_writing("/no/such/folder/out.json")
"folder '/no/such/folder' does not exist"
>>> problem_writing("/")
'is a folder; give a file name'
"""

from __future__ import annotations

import os
from pathlib import Path


def problem_writing(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as a file, or None if it can (as far as can be told
    without creating it)."""
    target = Path(path).expanduser()
    if target.is_dir():
        return "is a folder; give a file name"
    folder = target.resolve().parent
    if not folder.is_dir():
        return f"folder {str(folder)!r} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {str(folder)!r} is not writable"
    if target.exists() and not os.access(target, os.W_OK):
        return "exists and is not writable"
    return None
