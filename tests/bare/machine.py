"""The lent GPU machine's Python as the GPU check must find it (tests/bench/test_gpu_check.py): a
folder of links to torch, everything torch's installed distribution requires, and msgspec (the one
carried wheel), for an interpreter started with ``-S`` (no site-packages; its children started
the same way): nothing of gradsched's extras, of the tests' packages, or numpy (which torch uses
only if present) can be imported."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

#: the distributions the check's command has on the lent machine: its torch, and the wheels carried
ROOTS = ("torch", "msgspec")


def _requirements(name: str) -> list[str]:
    """The names of what distribution ``name`` requires, extras left out."""
    names = []
    for spec in metadata.distribution(name).requires or ():
        if re.search(r"extra\s*==", spec):
            continue
        names.append(re.split(r"[\s;<>=!~\[(]", spec, maxsplit=1)[0])
    return names


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The top-level names a distribution installed: its packages and single modules, and its
    metadata (torch 2.14 finds its own gloo backend through its entry points)."""
    names = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first.endswith((".egg-info", ".data")) or first in ("..", "__pycache__", "bin"):
            continue
        names.add(first)
    return names


def bare_site(folder: Path) -> Path:
    """Links, in ``folder``, to every top-level package of ROOTS and what they require."""
    folder.mkdir(parents=True, exist_ok=True)
    seen, queue = set(), list(ROOTS)
    while queue:
        name = queue.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a requirement for another platform, never installed
            continue
        queue += _requirements(name)
        for top in _top_level(dist):
            source = Path(dist.locate_file(top))
            link = folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return folder
