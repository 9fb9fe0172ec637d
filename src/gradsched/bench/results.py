"""What rank 0 reports after a benchmark run, as typed records: :class:`RankReport` (the
baselines it timed, the link it measured, the host's CPU shares) holding a :class:`RunReport`
per run, read once from the worker's JSON line; and how a dilated run's times are brought
back to undilated ones (every time divided by K, nothing else)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: the seconds inside the runtime's own reports (RunStats.as_dict) of a run
_TIMED = {"prediction": ("compute_s", "latency_s", "overhead_s", "comm_s", "policy_s", "fifo_s"),
          "trial": ("policy_s", "fifo_s"), "autotune": ("best_s", "default_s"), "ranks": ("median_s", "burst_slowest_s", "link_median_s")}


@dataclass(frozen=True)
class RunReport:
    """One run on rank 0: its iteration times, and what it says of itself."""

    times: list[float]
    plan: str | None = None  # gradsched: the policy of the plan it ended on
    plan_options: dict | None = None  # ... and its options (the sizes derived from the link included)
    prediction: dict | None = None  # gradsched's optimizer.stats, as a dict: the trial's prediction,
    trial: dict | None = None  # the measured trial,
    autotune: dict | None = None  # the online tuner's report
    bucket_cap_mb: float | None = None  # DDP baselines: the bucket size (ddp-tuned: the fastest)
    optimizer_state_bytes: int | None = None
    peak_memory_bytes: int | None = None  # the resident set's high-water mark added by the run (gradsched.bench.memory)
    peak_allocated_bytes: int | None = None  # the most bytes allocated at once above the run's start
    ranks: dict | None = None  # gradsched: every rank's backward pass compared, and the slow rank it named

    def described(self) -> dict[str, Any]:
        """Everything but its times, the fields it has (a row's ``reported``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "times" and getattr(self, f.name) is not None}

    def undilated(self, k: float) -> RunReport:
        reports = {name: {f: (v / k if f in fields and v is not None else v) for f, v in report.items()}
                   for name, fields in _TIMED.items() if isinstance(report := getattr(self, name), dict)}
        confirm = (reports.get("autotune") or {}).get("confirm")
        if isinstance(confirm, dict) and confirm.get("iteration_s") is not None:
            reports["autotune"]["confirm"] = dict(confirm, iteration_s=confirm["iteration_s"] / k)
        if "ranks" in reports:
            ranks = reports["ranks"]
            for field_name in ("backward_s", "link_out_s"):  # per rank (the ring probe's: 3+ ranks only)
                if ranks.get(field_name) is not None:
                    ranks[field_name] = [None if s is None else s / k for s in ranks[field_name]]
            if ranks.get("link_probes") is not None:  # per rank, each probe
                ranks["link_probes"] = [[s / k for s in probes] for probes in ranks["link_probes"]]
        return dataclasses.replace(self, times=[t / k for t in self.times], **reports)


@dataclass(frozen=True)
class RankReport:
    """Rank 0's result of one launch of the ranks."""

    compute: list[float]  # iterations computing only
    comm: list[float]  # rounds communicating only (every gradient, DDP's buckets, all in flight)
    latency: float  # one tiny message alone
    overhead: float  # per message, many in flight
    gradient_bytes: int
    world_size: int  # the workers
    host_cpu: dict[str, float] = field(default_factory=dict)  # run or phase -> the host's CPUs busy (0-1)
    comm_servers: list[float] | None = None  # parameter servers: communication only, through them
    comm_wire: list[float] | None = None  # --compression: communication only, in the wire dtype
    cast_s_per_byte: float | None = None  # and casting to it and back, per wire byte
    policies: dict[str, RunReport] = field(default_factory=dict)  # run name -> its report

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankReport:
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        fields["policies"] = {name: RunReport(**run) for name, run in data.get("policies", {}).items()}
        return cls(**fields)

    def undilated(self, k: float) -> RankReport:
        """Every time divided by ``k`` (a run dilated by K): series, the link's times, each run's."""
        if k == 1:
            return self
        series = {name: [t / k for t in values] for name in ("compute", "comm", "comm_servers", "comm_wire")
                  if (values := getattr(self, name)) is not None}
        return dataclasses.replace(
            self, **series, latency=self.latency / k, overhead=self.overhead / k,
            cast_s_per_byte=None if self.cast_s_per_byte is None else self.cast_s_per_byte / k,
            policies={name: run.undilated(k) for name, run in self.policies.items()})
