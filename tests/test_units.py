import pytest

from gradsched.units import format_bandwidth, format_bytes, format_duration, parse_bandwidth, parse_bytes, parse_duration


@pytest.mark.parametrize(
    "text,bits",
    [("10Gbit", 1e10), ("10Gbps", 1e10), ("10Gbit/s", 1e10), ("100Mbit", 1e8), ("1.25GB/s", 1e10),
     ("10G", 1e10), ("5", 5e9), ("2.5", 2.5e9), ("800kbit", 8e5), ("1e3Mbit", 1e9), (" 25 Gbit ", 2.5e10)],
)
def test_bandwidths(text, bits):
    assert parse_bandwidth(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["", "fast", "10Gbt", "-1Gbit", "0", "0Gbit", "10 Gbit extra", "1..2G"])
def test_bad_bandwidths(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


@pytest.mark.parametrize(
    "text,seconds", [("50us", 5e-5), ("50µs", 5e-5), ("1ms", 1e-3), ("0.5s", 0.5), ("100ns", 1e-7), ("0", 0.0), ("2min", 120.0)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["50", "1 hour", "-5us", "ms"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text,n", [("4MiB", 4 << 20), ("25MB", 25_000_000), ("512KiB", 512 << 10), ("1048576", 1 << 20), ("1GiB", 1 << 30), (7, 7)]
)
def test_sizes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["4M", "4Mi", "iB", "1.5B", "big", "-4MiB"])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)


def test_formatting():
    assert format_bandwidth(1e10) == "10 Gbit/s"
    assert format_duration(5e-5) == "50 us"
    assert format_bytes(4 << 20) == "4 MiB"
