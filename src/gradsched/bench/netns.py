"""An emulated cluster on one machine: one Linux network namespace per rank, joined by a
bridge, each rank's link limited with ``tc`` in both directions.

Rank r lives in namespace ``gs<run>-<r>`` with interface ``eth0`` at ``10.<a>.<b>.<r+1>``;
the host side of its veth pair is attached to bridge ``gs<run>br``. The rate limit is a
token bucket (``tbf``) on both ends of the pair: on ``eth0`` for what the rank sends, on the
host side for what it receives; optional latency is ``netem`` in front of each bucket.

The links carry jumbo frames (:data:`JUMBO_MTU`, on both ends of every pair and on the
bridge). The bound is measured through these same links, so framing is counted in it
either way; what the frame size changes is the host's work per byte, 40 times as many
packets through veth, the bridge and tc at 1500 bytes. Measured with ResNet-50's gradients at
3 Gbit/s on 2 cores: communication alone took 1.058x the link's time at 1500 bytes and
1.001x at 65000, and DDP's run kept the host 36% and 29% busy (docs/bench.md, "Jumbo
frames"). The host's packet work is the emulation's cost, not the cluster's (NICs
offload it), so the frames are close to the largest veth allows (65535).

Everything is created by :meth:`EmulatedCluster.__enter__` and removed by ``__exit__``,
whatever happened in between; at every start, :func:`remove_stale` removes what earlier,
killed runs left behind (names start with ``gs`` and the run id, the creating process's id
in base 36, so a run whose process is gone is recognised), so a run after a crash works. Needs root and iproute2's ``ip`` and ``tc``: :func:`available` says whether
they are usable and, if not, why.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import zlib
from typing import Sequence

PREFIX = "gs"
JUMBO_MTU = 65000  # bytes per frame on the emulated links (veth allows up to 65535)


class ClusterError(RuntimeError):
    """The emulated network could not be built."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def available() -> tuple[bool, str]:
    """(True, "") if namespaces and tc can be used here, else (False, the reason)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' was not found (install iproute2)"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
    except ClusterError as exc:
        return False, f"cannot create a network namespace: {exc}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return True, ""


def _run_id(pid: int) -> str:
    """A run id: the process id in base 36 (at most 5 characters, so names fit 15)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        pid, d = divmod(pid, 36)
        out = digits[d] + out
        if not pid:
            return out


def _alive(run_id: str) -> bool:
    try:
        os.kill(int(run_id, 36), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def remove_stale(run_id: str | None = None) -> list[str]:
    """Delete namespaces and links of earlier runs: of ``run_id``, or, if None, of every run
    whose process is gone (run ids are the creating process's id in base 36)."""
    pattern = re.compile(rf"^{PREFIX}({re.escape(run_id) if run_id else '[0-9a-z]+'})(-\d+|br)")
    removed = []

    def stale(name: str) -> bool:
        match = pattern.match(name)
        return bool(match) and (run_id is not None or not _alive(match.group(1)))

    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if stale(name):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if stale(name):
                _run("ip", "link", "del", name, check=False)
                removed.append(name)
    return removed


class EmulatedCluster:
    """``with EmulatedCluster(2, bandwidth_bps=5e9) as cluster: cluster.command(0, [...])``"""

    def __init__(self, ranks: int, bandwidth_bps: float | None, latency_s: float = 0.0, run_id: str | None = None,
                 mtu: int = JUMBO_MTU, slower: dict[int, float] | None = None):
        if ranks < 1 or ranks > 250:
            raise ValueError(f"ranks must be in 1..250, got {ranks}")
        if bandwidth_bps is not None and not bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be > 0, got {bandwidth_bps}")
        if latency_s < 0:
            raise ValueError(f"latency must be >= 0, got {latency_s}")
        if not 576 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {mtu}")
        for rank, factor in (slower or {}).items():
            if not 0 <= rank < ranks or not factor >= 1:
                raise ValueError(f"slower: a rank in 0..{ranks - 1} and a factor >= 1, got {rank}: {factor}")
        self.slower = dict(slower or {})  # rank -> its link that many times slower (a straggler's)
        self.ranks = ranks
        self.mtu = mtu
        self.bandwidth_bps = bandwidth_bps
        self.latency_s = latency_s
        self.run_id = run_id or _run_id(os.getpid())
        if not re.fullmatch(r"[0-9a-z]{1,5}", self.run_id):
            raise ValueError(f"run_id must be 1-5 lowercase letters or digits, got {self.run_id!r}")
        subnet = zlib.crc32(self.run_id.encode()) % 250
        self.addresses = [f"10.213.{subnet}.{r + 1}" for r in range(ranks)]
        self.bridge = f"{PREFIX}{self.run_id}br"
        self.namespaces = [f"{PREFIX}{self.run_id}-{r}" for r in range(ranks)]
        self._created = False

    @property
    def interface(self) -> str:
        return "eth0"

    def __enter__(self) -> EmulatedCluster:
        remove_stale(self.run_id)
        remove_stale()  # what killed runs left behind
        self._created = True
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for rank, ns in enumerate(self.namespaces):
                host = f"{ns}h"
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", host, "mtu", str(self.mtu), "type", "veth", "peer", "name", f"{ns}n",
                     "mtu", str(self.mtu))
                _run("ip", "link", "set", host, "master", self.bridge)
                _run("ip", "link", "set", host, "up")
                _run("ip", "link", "set", f"{ns}n", "netns", ns)
                self._in(ns, "ip", "link", "set", f"{ns}n", "name", "eth0")
                self._in(ns, "ip", "addr", "add", f"{self.addresses[rank]}/24", "dev", "eth0")
                self._in(ns, "ip", "link", "set", "eth0", "up")
                self._in(ns, "ip", "link", "set", "lo", "up")
            _run("ip", "link", "set", self.bridge, "mtu", str(self.mtu))  # a bridge takes its ports' MTU; set it too
            self.set_link(self.bandwidth_bps, self.latency_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def set_link(self, bandwidth_bps: float | None, latency_s: float = 0.0) -> None:
        """(Re)shape every rank's link in both directions (the ranks in ``slower`` at that fraction
        of ``bandwidth_bps``); None removes the limit."""
        self.bandwidth_bps, self.latency_s = bandwidth_bps, latency_s
        for rank, ns in enumerate(self.namespaces):
            rate = bandwidth_bps / self.slower.get(rank, 1.0) if bandwidth_bps else None
            for where in ((ns, "eth0"), (None, f"{ns}h")):
                self._shape(*where, rate)

    def set_slower(self, rank: int, factor: float) -> None:
        """Rank ``rank``'s link ``factor`` times slower than the others' from now on (1: as fast),
        both directions changed in place: what is queued stays queued (a straggler's link in
        bursts, gradsched.bench.link_bursts)."""
        if not 0 <= rank < self.ranks or not factor >= 1:
            raise ValueError(f"set_slower: a rank in 0..{self.ranks - 1} and a factor >= 1, got {rank}: {factor}")
        if not self.bandwidth_bps:
            raise ValueError("set_slower needs a bandwidth limit to slow")
        self.slower[rank] = factor
        ns = self.namespaces[rank]
        for where in ((ns, "eth0"), (None, f"{ns}h")):
            # the bucket keeps the fast rate's depth (a packet queued under a deeper bucket than
            # the new one would never fit it, and the link would stall for good) and its queue in
            # bytes (a switch's buffer: shrunk, it would drop what the sender had in flight)
            self._bucket(*where, self.bandwidth_bps / factor, "change", depth_bps=self.bandwidth_bps)

    def _shape(self, ns: str | None, dev: str, bandwidth_bps: float | None) -> None:
        prefix = ["ip", "netns", "exec", ns] if ns else []
        _run(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        if self.latency_s > 0:
            delay = f"{self.latency_s * 1e6:.0f}us"
            try:
                _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", delay)
            except ClusterError as exc:
                raise ClusterError(
                    f"cannot add latency: this kernel has no netem qdisc (sch_netem); run without --latency ({exc})"
                ) from None
        if bandwidth_bps:
            self._bucket(ns, dev, bandwidth_bps, "add")

    def _bucket(self, ns: str | None, dev: str, bandwidth_bps: float, verb: str, depth_bps: float | None = None) -> None:
        """Add (or change) ``dev``'s token bucket, behind the latency's netem where there is one
        (its depth that of ``depth_bps`` if given, else of the rate)."""
        prefix = ["ip", "netns", "exec", ns] if ns else []
        parent = ["parent", "1:1"] if self.latency_s > 0 else ["root"]
        # a bucket of ~2 ms of traffic (at least 64 KiB: a GSO segment, and more than one frame)
        # keeps tbf accurate at high rates
        burst = max(65536, self.mtu + 1024, int((depth_bps or bandwidth_bps) / 8 * 0.002))
        # the queue: 100 ms of traffic at the rate (tbf's latency), or at depth_bps in bytes
        queue = ["latency", "100ms"] if depth_bps is None else ["limit", str(int(depth_bps / 8 * 0.1) + burst)]
        _run(*prefix, "tc", "qdisc", verb, "dev", dev, *parent, "handle", "10:", "tbf", "rate",
             f"{bandwidth_bps:.0f}bit", "burst", str(burst), *queue)

    def _in(self, ns: str, *argv: str) -> None:
        _run("ip", "netns", "exec", ns, *argv)

    def kill_processes(self) -> None:
        """SIGKILL whatever still runs in the namespaces (torchrun's workers run in sessions
        of their own, beyond the reach of a signal to torchrun's process group)."""
        for ns in self.namespaces if self._created else []:
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside rank ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    def __exit__(self, *exc) -> None:
        if not self._created:
            return
        self._created = False
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
            _run("ip", "link", "del", f"{ns}h", check=False)
        _run("ip", "link", "del", self.bridge, check=False)
