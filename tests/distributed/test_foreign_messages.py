"""Nothing received over the network is unpickled: foreign and malformed messages are
refused with an error naming the sender and the fault (2 real gloo ranks)."""

from __future__ import annotations

import json

from gradsched.runtime.comm import wire_format
from workers.launch import run_ranks


def test_foreign_messages_are_refused_and_never_unpickled(tmp_path):
    out, marker = tmp_path / "out.json", tmp_path / "exploited"
    results = run_ranks("foreign", 2, str(out), str(marker), timeout=120)
    assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
    server = json.loads((tmp_path / "out.json.1").read_text())
    pickled, newer, typed, truncated, kind, size = server["errors"]
    assert "a message from rank 0 is not a gradsched message" in pickled
    version = wire_format.VERSION
    assert f"rank 0 speaks gradsched wire format version {version + 1}, this rank version {version}" in newer
    assert "a malformed 'plan' message from rank 0: Expected `int`, got `str` - at `$.plan.messages[0].nbytes`" in typed
    assert "a message from rank 0 is not a gradsched message" in truncated
    assert "expected a 'plan' message from rank 0, got a 'checks' message" in kind
    assert "rank 0 announced a message of -5 bytes" in size
    assert server["good"]  # the stream still works after the refusals
    assert not marker.exists() and not server["exploited"]
    # ranks of different wire-format versions: both refuse at wrap time, parameters untouched
    for rank in (0, 1):
        report = json.loads((tmp_path / f"out.json.{rank}").read_text())
        assert "wire format version" in report["versions"] and "run the same gradsched version on every rank" \
            in report["versions"], report
        assert report["untouched"]
