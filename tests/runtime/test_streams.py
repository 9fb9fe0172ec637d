"""The data plane's stream bookkeeping that holds without a GPU (gradsched.runtime.comm.streams):
a message waits for the latest event of each stream that produced its gradients, once each."""

from __future__ import annotations

from gradsched.runtime.comm.streams import Produced, latest_per_stream, own_stream, produced_here, record, wait_for


def test_a_message_waits_for_the_latest_event_of_each_producing_stream():
    produced = [Produced(1, 0, "a0"), Produced(2, 1, "b1"), Produced(1, 3, "a3"), None, Produced(1, 2, "a2"),
                Produced(2, 4, "b4")]
    assert sorted(latest_per_stream(produced)) == ["a3", "b4"]
    assert latest_per_stream([None, None]) == []


def test_on_cpu_nothing_is_recorded_or_waited_for():
    assert produced_here(None) is None and record(None) is None
    assert wait_for(None, ["an event"]) == 0
    with own_stream(None) as stream:
        assert stream is None
