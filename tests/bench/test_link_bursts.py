"""A straggler's link slowed in bursts by the clock (issue 58, part 2): the launcher's LinkSwitch
reshapes both ends of the rank's link (EmulatedCluster.set_slower) slow, then fast, on time, and
real TCP transfers through it, out of the rank and into it, move at the rate averaged over the
clock. Namespaces removed afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gradsched.bench import EmulatedCluster
from gradsched.bench.link_bursts import LinkSwitch
from gradsched.bench.straggler import Straggler
from netns_helpers import needs_netns

RECEIVE = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
conn, _ = server.accept()
while conn.recv(1 << 20):
    pass
conn.sendall(b"k")
"""
SEND = """
import socket, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = socket.create_connection((host, port))
start = time.perf_counter()
conn.sendall(bytes(size))
conn.shutdown(socket.SHUT_WR)
conn.recv(1)
print(time.perf_counter() - start)
"""


def _transfer_s(cluster: EmulatedCluster, src: int, dst: int, nbytes: int, port: int) -> float:
    """Seconds to send ``nbytes`` over TCP from rank ``src``'s namespace to ``dst``'s and hear back."""
    receiver = subprocess.Popen(cluster.command(dst, [sys.executable, "-c", RECEIVE, str(port)]),
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "listening"
        sent = subprocess.run(cluster.command(src, [sys.executable, "-c", SEND, cluster.addresses[dst], str(port),
                                                    str(nbytes)]), capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        return float(sent.stdout)
    finally:
        receiver.wait(timeout=30)


def _rates(cluster: EmulatedCluster, rank: int) -> list[str]:
    """The token buckets' rates on rank ``rank``'s two ends, as tc shows them."""
    ns = cluster.namespaces[rank]
    shown = [subprocess.run(argv, capture_output=True, text=True, check=True).stdout
             for argv in (["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0"],
                          ["tc", "qdisc", "show", "dev", f"{ns}h"])]
    return [text.split(" rate ")[1].split()[0] for text in shown]


@needs_netns
def test_a_link_in_bursts_is_switched_by_the_clock_and_transfers_meet_its_mean_rate():
    """Rank 1's link 3x slower for 50 of every 100 ms (2/3 of its rate on average) at 80 Mbit/s:
    4 MiB out of rank 1 and into it take about 1.5x as long as with the link fast throughout
    (0.42 s against 0.63 s, many periods each); the changes alternate on time, each quick; rank
    0's link is never touched, and rank 1's is fast again afterwards."""
    straggler = Straggler(1, 3.0, link=True, slow_s=0.05, period_s=0.1)
    size = 4 << 20
    with EmulatedCluster(2, 80e6, run_id="t7") as cluster:
        fast = (_transfer_s(cluster, 1, 0, size, 29641), _transfer_s(cluster, 0, 1, size, 29642))
        with LinkSwitch(cluster, straggler) as switch:
            bursty = (_transfer_s(cluster, 1, 0, size, 29643), _transfer_s(cluster, 0, 1, size, 29644))
        assert _rates(cluster, 0) == ["80Mbit", "80Mbit"] and _rates(cluster, 1) == ["80Mbit", "80Mbit"]
    assert not switch.errors
    assert 0.35 < fast[0] < 0.55 and 0.35 < fast[1] < 0.55, fast  # 4 MiB at 80 Mbit/s: 0.42 s
    for seconds, base in zip(bursty, fast):
        assert 1.25 < seconds / base < 1.8, (bursty, fast)  # measured 1.50-1.63 (also with both cores busy)
    states = [slow for slow, _, _ in switch.changes]
    assert states == [i % 2 == 0 for i in range(len(states))] and len(states) >= 16 and states[-1] is False
    begun = [start for _, start, _ in switch.changes]
    gaps = [later - earlier for earlier, later in zip(begun, begun[1:-1])]
    assert 0.045 < sum(gaps) / len(gaps) < 0.06, gaps  # 50 ms each, kept by the clock
    assert max(took for _, _, took in switch.changes) < 0.5


def test_a_link_switch_refuses_what_is_not_a_link_in_bursts():
    for straggler in (Straggler(1, 2.0), Straggler(1, 2.0, link=True), Straggler(1, 2.0, slow=1, period=2)):
        with pytest.raises(ValueError, match="link slowed in bursts"):
            LinkSwitch(None, straggler)
    with pytest.raises(ValueError, match="dilation"):
        LinkSwitch(None, Straggler(1, 2.0, link=True, slow_s=0.1, period_s=0.2), dilation=0)
