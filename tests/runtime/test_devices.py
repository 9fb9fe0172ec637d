"""The devices the data plane orders its work on (gradsched.runtime.device), without a GPU: the
bookkeeping every device shares, the host's nothing-to-order, what makes a CUDA environment
unable to overlap, and the emulated NCCL: streams as FIFO executors, events, collectives that
complete when queued and run later, futures whose callbacks run behind their events, and a
read not ordered after a collective getting the value it had before (traced exactly)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gradsched.runtime.config import Environment, _emulation
from gradsched.runtime.device import Produced, device_for, future_of, latest_per_stream
from gradsched.runtime.device.cuda import overlap_warning
from gradsched.runtime.device.emulated import EmulatedNccl, EmulationError
from gradsched.runtime.device.emulated_streams import DONE, EmulatedStream, current_stream
from gradsched.runtime.device.host import HostDevice
from gradsched.runtime.errors import GradschedError

GROUP = object()  # a process group's stand-in: the emulation keys a stream by it


def environment(**fields) -> Environment:
    return Environment(**{"policy": None, "ordered_completion": False, "ps_piece_bytes": None,
                          "ddp_side_stream": True, **fields})


def done_future(value) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(value)
    return future


def doubling(buffer: torch.Tensor, trace: list | None = None):
    """A collective's start that doubles ``buffer`` when it runs (two equal ranks summing it)."""
    def start():
        if trace is not None:
            trace.append(f"collective reads {buffer.tolist()}")
        buffer.mul_(2)
        return done_future([buffer])
    return start


# -- shared bookkeeping, the host, the environment ---------------------------------------------
def test_a_message_waits_for_the_latest_event_of_each_producing_stream():
    produced = [Produced(1, 0, "a0"), Produced(2, 1, "b1"), Produced(1, 3, "a3"), None, Produced(1, 2, "a2"),
                Produced(2, 4, "b4")]
    assert sorted(latest_per_stream(produced)) == ["a3", "b4"]
    assert latest_per_stream([None, None]) == []


def test_the_host_orders_nothing_and_issues_at_once():
    host = HostDevice()
    assert host.record() is None and host.produced() is None and host.wait_for(["an event"]) == 0
    with host.own_stream("launcher") as stream:
        assert stream is None
    buffer = torch.ones(2)
    assert host.issue(GROUP, doubling(buffer)).value() == [buffer] and buffer.tolist() == [2.0, 2.0]
    assert [f.value() for f in host.issue_each(GROUP, lambda: [done_future(1), done_future(2)], 2)] == [1, 2]
    assert host.run(GROUP, lambda: "ran") == "ran"


def test_future_of_takes_a_works_future_or_the_future_itself():
    future = done_future(3)

    class Work:
        def get_future(self):
            return future

    assert future_of(Work()) is future and future_of(future) is future


def test_the_environment_chooses_the_device():
    assert isinstance(device_for([torch.zeros(1)], environment(), 30.0), HostDevice)
    emulated = device_for([torch.zeros(1)], environment(emulate_nccl=(0.01, 0.002)), 30.0)
    assert isinstance(emulated, EmulatedNccl) and (emulated.latency_s, emulated.duration_s) == (0.01, 0.002)
    assert emulated.timeout_s == 30.0
    emulated.close()


@pytest.mark.parametrize("value", ["fast", "0.1,0.2,0.3", "-1", ","])
def test_a_malformed_emulation_setting_says_what_is_expected(value):
    with pytest.raises(ValueError, match="LATENCY or LATENCY,DURATION"):
        _emulation(value)


def test_one_hardware_queue_is_said_to_make_overlap_impossible():
    assert "no communication can overlap computation" in overlap_warning("1")
    assert overlap_warning(None) is None and overlap_warning("8") is None and overlap_warning("32") is None


# -- emulated streams and events --------------------------------------------------------------
def test_a_stream_runs_its_work_in_order_and_an_event_completes_after_what_came_before():
    trace, gate = [], threading.Event()
    stream = EmulatedStream("s")
    stream.submit(lambda: (gate.wait(5), trace.append("first")))
    event = stream.record()
    stream.submit(lambda: trace.append("second"))
    assert not event.query() and trace == []  # held at the first work
    gate.set()
    event.synchronize(5)
    stream.synchronize(5)
    assert trace == ["first", "second"] and event.query()
    stream.close()


def test_a_stream_that_waits_for_an_event_runs_its_later_work_after_it():
    trace, gate = [], threading.Event()
    producer, consumer = EmulatedStream("producer"), EmulatedStream("consumer")
    producer.submit(lambda: (gate.wait(5), trace.append("produced")))
    consumer.wait_event(producer.record())
    consumer.submit(lambda: trace.append("consumed"))
    time.sleep(0.05)
    assert trace == []
    gate.set()
    consumer.synchronize(5)
    assert trace == ["produced", "consumed"]
    producer.close(), consumer.close()


def test_a_failure_fails_the_stream_and_every_later_event_of_it():
    stream = EmulatedStream("s")
    stream.submit(lambda: 1 / 0)
    ran = []
    stream.submit(lambda: ran.append("after"))
    with pytest.raises(ZeroDivisionError):
        stream.synchronize(5)
    later = stream.record()
    with pytest.raises(ZeroDivisionError):
        later.synchronize(5)
    with pytest.raises(ZeroDivisionError):
        later.query()
    assert ran == []  # nothing runs on a failed stream
    stream.close()


def test_the_host_waits_no_longer_than_the_timeout():
    stream = EmulatedStream("s")
    gate = threading.Event()
    stream.submit(lambda: gate.wait(5))
    with pytest.raises(GradschedError, match="timed out after 0 s"):
        stream.record().synchronize(0.05)
    gate.set()
    stream.close()


# -- the emulated device ------------------------------------------------------------------------
def test_a_collective_completes_when_queued_and_reads_its_buffer_when_it_runs():
    device = EmulatedNccl(latency_s=0.1)
    trace: list[str] = []
    buffer = torch.ones(2)
    future = device.issue(GROUP, doubling(buffer, trace))
    assert future.done()  # as NCCL's: done once queued
    with pytest.raises(EmulationError):
        future.value()  # (NCCL's gives the buffers at once; here the value comes from gloo, once it ran)
    buffer.add_(1)  # a producer writing after the issue, before the collective ran
    trace.append(f"read without a wait {buffer.tolist()}")
    assert future.wait() == [buffer]  # the host: blocks until the collective ran
    trace.append(f"read after wait() {buffer.tolist()}")
    assert trace == ["read without a wait [2.0, 2.0]", "collective reads [2.0, 2.0]", "read after wait() [4.0, 4.0]"]
    assert [name for name, _, _ in device.log] == [device.stream_of(GROUP).name]
    device.close()


def test_a_communication_stream_waits_without_holding_its_thread():
    device = EmulatedNccl(latency_s=0.1)
    buffer = torch.ones(1)
    future = device.issue(GROUP, doubling(buffer))
    with device.own_stream("completion") as stream:
        assert current_stream() is stream
        started = time.monotonic()
        future.wait()  # the stream waits; this thread goes on
        end = device.record()
        assert time.monotonic() - started < 0.05 and not device.passed(end)
    assert current_stream() is None
    end.synchronize(5)
    assert buffer.tolist() == [2.0] and device.passed(end)
    device.close()


def test_a_callback_runs_behind_the_collective_and_its_value_is_not_there_before():
    device = EmulatedNccl(latency_s=0.1)
    buffer, copy = torch.ones(2), torch.zeros(2)
    chained = device.issue(GROUP, doubling(buffer)).then(lambda f: copy.copy_(f.value()[0]))
    assert copy.tolist() == [0.0, 0.0]  # the copy back has not run
    with pytest.raises(EmulationError, match="without wait"):
        chained.value()  # on NCCL: values still being written
    assert chained.wait() is copy and copy.tolist() == [2.0, 2.0]
    done = []
    chained.add_done_callback(lambda f: done.append(f))  # host work: at once
    assert done == [chained]
    device.close()


def test_a_collective_that_fails_fails_what_waits_for_it():
    device = EmulatedNccl(latency_s=0.0)

    def broken():
        raise RuntimeError("gloo: connection closed")

    future = device.issue(GROUP, broken)
    with pytest.raises(RuntimeError, match="connection closed"):
        future.wait()
    with pytest.raises(RuntimeError, match="connection closed"):
        future.then(lambda f: None).wait()  # a callback behind it fails too
    device.close()


def test_work_run_in_a_groups_order_runs_after_what_was_queued_on_it():
    device = EmulatedNccl(latency_s=0.1)
    buffer = torch.ones(1)
    device.issue(GROUP, doubling(buffer))
    assert device.run(GROUP, lambda: buffer.item()) == 2.0  # the probe sees the group idle
    device.close()


def test_groups_have_streams_of_their_own_and_the_issuing_stream_comes_first():
    device = EmulatedNccl(latency_s=0.0)
    trace, gate = [], threading.Event()
    other = object()
    with device.own_stream("launcher") as launcher:
        launcher.submit(lambda: (gate.wait(5), trace.append("launcher's work")))
        a = device.issue(GROUP, lambda: trace.append("collective on GROUP") or done_future(None))
    b = device.issue(other, lambda: trace.append("collective on another group") or done_future(None))
    b.wait()
    assert trace == ["collective on another group"]  # not behind GROUP's, which waits for the launcher
    gate.set()
    a.wait()
    assert trace == ["collective on another group", "launcher's work", "collective on GROUP"]
    assert device.stream_of(GROUP) is not device.stream_of(other)
    assert device.record() is DONE  # the host's work is done when issued
    device.close()


def test_a_read_that_skips_the_event_sees_the_value_from_before_the_reduction():
    """The planted defect at its smallest: a consumer that takes "resolved" (the future is done)
    for "reduced" reads the buffer as it was; one that waits reads the sum."""
    device = EmulatedNccl(latency_s=0.05)
    buffer = torch.full((3,), 5.0)
    future = device.issue(GROUP, doubling(buffer))
    skipped = buffer.clone() if future.done() else None
    future.wait()
    assert skipped.tolist() == [5.0] * 3 and buffer.tolist() == [10.0] * 3
    device.close()


# -- where CUDA orders differently (issue 54): each rule, and the defect it catches ------------------
def test_a_callback_that_returns_no_tensor_gives_a_child_that_orders_nothing():
    """c10's rule: a CUDA future records events for the devices of the tensors its value holds. A
    copy back that returns nothing leaves its child without events, so a consumer waiting for it
    is not ordered after the copy: here its waiter fails; one that returns what it wrote orders."""
    device = EmulatedNccl(latency_s=0.05)
    buffer, copy = torch.ones(2), torch.zeros(2)
    def copy_back(f):
        copy.copy_(f.value()[0])  # returns nothing

    returns_nothing = device.issue(GROUP, doubling(buffer)).then(copy_back)
    with pytest.raises(EmulationError, match="returned no tensor"):
        returns_nothing.wait()
    copy.zero_()
    returns_it = device.issue(GROUP, doubling(buffer)).then(lambda f: [copy.copy_(f.value()[0])])
    with device.own_stream("completion"):
        returns_it.wait()  # a stream orders itself after the copy
        end = device.record()
    end.synchronize(5)
    assert copy.tolist() == [4.0, 4.0]
    device.close()


def test_a_gradient_reads_as_nan_until_its_producers_event():
    """The training stream lags: a consumer that waits for the event ``produced`` returned reads
    the gradient; one that does not reads NaN (the launcher that skips its wait)."""
    device = EmulatedNccl(latency_s=0.05)
    grad = torch.full((3,), 2.0)
    produced = device.produced(written=grad)
    with device.own_stream("launcher"):
        skipped = grad.clone()  # no wait: packed at once
        device.wait_for([produced.event])  # the launcher's wait (its tensor work is the host's here)
        waited = grad.clone()
    assert skipped.isnan().all() and waited.tolist() == [2.0] * 3
    assert device.produced() is None and device.produced(written=torch.zeros(2, dtype=torch.int64)) is None
    later = device.produced(written=torch.ones(1))
    assert later.stream == produced.stream and later.order > produced.order  # one training stream, in order
    device.wait_for([later.event])
    device.close()


def test_memory_let_go_of_before_a_callback_ran_is_handed_to_it_poisoned():
    """The caching allocator: a callback's tensor arguments (a partial's) count only while
    something else refers to their memory; the collective's future lets go of its value once it
    ran. A buffer kept referenced is copied back; one let go of comes back NaN."""
    import functools

    def copy_back(result, target, future):
        future.value()
        target.copy_(result)
        return [target]

    device = EmulatedNccl(latency_s=0.05)
    for keep in (True, False):
        packed, target = torch.full((2,), 3.0), torch.zeros(2)
        chained = device.issue(GROUP, doubling(packed)).then(functools.partial(copy_back, packed, target))
        kept = [packed] if keep else []
        packed = None  # the launcher's own reference goes
        chained.wait()
        assert target.tolist() == [6.0, 6.0] if keep else target.isnan().all(), (keep, target)
        del kept
    view_target, source = torch.zeros(4), torch.ones(2)  # a view's own object may go: its memory is the base's
    chained = device.issue(GROUP, doubling(torch.ones(2))).then(
        functools.partial(copy_back, source, view_target[1:3]))
    chained.wait()
    assert view_target.tolist() == [0.0, 1.0, 1.0, 0.0]
    device.close()


def test_the_emulated_streams_belong_to_the_process_and_its_roles():
    """As gradsched's CUDA streams (one per device and role in a process): two wraps' devices
    share the launcher's stream and the callbacks' pool; each process group has its own."""
    first, second = EmulatedNccl(), EmulatedNccl()
    with first.own_stream("launcher") as a, second.own_stream("launcher") as b:
        assert a is b
    with first.own_stream("completion") as c:
        assert c is not a
    other = object()
    assert first.stream_of(GROUP) is not first.stream_of(other)
    first.close()
    second.close()


class _TimedDevice(HostDevice):
    """A device whose timed events are numbers on a clock of its own (a GPU's, running behind)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.asked: list[tuple[float, float]] = []

    def timed_event(self) -> float:
        self.now += 1.0
        return self.now

    def seconds_between(self, first: float, second: float) -> float:
        self.asked.append((first, second))
        return (second - first) * 10.0  # the device took ten times what the host saw


def test_the_clock_times_through_its_device_only():
    """The training thread's stamps record the device's timed events (no CUDA call of the
    clock's own) and resolve to device times through the same device; the host's clock where
    the device records none."""
    from gradsched.runtime.planning.clock import Clock
    from gradsched.runtime.planning.profiling import RoundTiming

    device, timing = _TimedDevice(), RoundTiming()
    clock = Clock(device)
    timing.forward_start = clock.stamp(timing, "forward_start")
    timing.forward_end = clock.stamp(timing, "forward_end")
    timing.ready["w"] = clock.stamp(timing, ("ready", "w"))
    assert timing.events == {"forward_start": 101.0, "forward_end": 102.0, ("ready", "w"): 103.0}
    resolved = clock.resolve(timing)
    assert resolved.forward_end == pytest.approx(timing.forward_start + 10.0)
    assert resolved.ready["w"] == pytest.approx(timing.forward_start + 20.0) and resolved.events == {}
    assert clock.between(timing, timing) == 0.0 and device.asked[-1] == (101.0, 101.0)
    host = RoundTiming()
    host.forward_start = Clock(HostDevice()).stamp(host, "forward_start")
    assert host.events == {} and Clock(HostDevice()).resolve(host) is host
    with pytest.raises(TypeError, match="host's clock"):
        EmulatedNccl(0.0, 0.0, 1.0).seconds_between(None, None)
