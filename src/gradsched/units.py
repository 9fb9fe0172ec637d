"""Parsing and formatting of the physical quantities users type: bandwidth, time, bytes.

Every parser raises :class:`ValueError` with a message that names the bad text and shows
an accepted spelling, so the CLI can print it as one line.

>>> parse_bandwidth("10Gbit")
10000000000.0
>>> parse_duration("1.5ms")
0.0015
>>> parse_bytes("4MiB")
4194304
"""

from __future__ import annotations

import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}

_BANDWIDTH = re.compile(
    rf"^{_NUMBER}\s*([kKmMgGtT]?)(bit/s|bits/s|bit|bps|b/s|b|B/s|Bps|byte/s)?$"
)


def parse_bandwidth(text: str) -> float:
    """Bandwidth in bits per second.

    Accepts ``10Gbit``, ``10Gbps``, ``10Gbit/s``, ``100Mbit``, ``1.25GB/s`` (bytes), ``10G``
    and a bare number, which is read as Gbit/s (``--sweep-bandwidth 1,2,5``).
    """
    s = str(text).strip()
    m = _BANDWIDTH.match(s)
    if not m:
        raise ValueError(
            f"invalid bandwidth {text!r}: use a number with a unit, e.g. 10Gbit, 100Mbit, "
            "1.25GB/s, or a bare number of Gbit/s"
        )
    value, prefix, unit = float(m.group(1)), m.group(2).lower(), m.group(3)
    if not prefix and not unit:
        bits = value * 1e9
    else:
        per_byte = unit in ("B/s", "Bps", "byte/s")
        bits = value * _SI[prefix] * (8.0 if per_byte else 1.0)
    if not bits > 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}")
    return bits


_DURATION = re.compile(rf"^{_NUMBER}\s*(ns|us|µs|ms|s|min)?$")
_PER_SECOND = {"ns": 1e9, "us": 1e6, "µs": 1e6, "ms": 1e3, "s": 1.0}


def parse_duration(text: str) -> float:
    """Duration in seconds: ``50us``, ``1ms``, ``0.5s``, ``100ns``; ``0`` needs no unit."""
    s = str(text).strip()
    m = _DURATION.match(s)
    if not m or (m.group(2) is None and float(m.group(1)) != 0.0):
        raise ValueError(f"invalid duration {text!r}: use a number with a unit, e.g. 50us, 1ms, 0.2s")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * 60.0 if unit == "min" else value / _PER_SECOND[unit]  # divide: 50us == 5e-05 exactly


_BYTES = re.compile(rf"^{_NUMBER}\s*([kKmMgGtT]?)(i?)(B)?$")


def parse_bytes(text: str | int) -> int:
    """A size in bytes: ``4MiB``, ``25MB``, ``64KiB``, ``1048576`` (bare = bytes)."""
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip()
        m = _BYTES.match(s)
        if not m or (m.group(2) and not m.group(4)) or (m.group(3) and not m.group(2)):
            raise ValueError(f"invalid size {text!r}: use e.g. 4MiB, 25MB, 512KiB or a number of bytes")
        prefix = m.group(2).lower()
        if m.group(3):
            scale = 1024 ** "kmgt".index(prefix) * 1024
        else:
            scale = _SI[prefix]
        value = float(m.group(1)) * scale
        if value != int(value):
            raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
        value = int(value)
    if value < 0:
        raise ValueError(f"size must be >= 0, got {text!r}")
    return value


def format_bandwidth(bits_per_s: float) -> str:
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g} {unit}"
    return f"{bits_per_s:g} bit/s"


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:g} B"
