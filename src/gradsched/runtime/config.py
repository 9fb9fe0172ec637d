"""Validated configuration of a wrapped model (everything but the policy's own options)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeConfig:
    find_unused_parameters: bool = False  # parameters may get no gradient in a backward pass
    broadcast_buffers: bool = True  # copy rank 0's buffers (BatchNorm statistics) before each forward, as DDP
    broadcast_parameters: bool = False  # at wrap, copy rank 0's parameters instead of requiring equal ones
    profile_rounds: int = 3  # backward passes timed (after the first) before the first measured plan
    replan_every: int = 50  # backward passes between later re-planning points; 0: never re-plan
    timeout_s: float = 300.0  # give up on a stuck or dead rank after this long
    fallback: bool = True  # use DDP-style buckets when the policy is not predicted to beat them
    fallback_gain: float = 0.02  # ... by at least this fraction of the iteration time
    trial_rounds: int = 5  # backward passes per measured arm (buckets, tuner candidates)
    autotune: bool = False  # tune the policy's options online (see gradsched.runtime.planning)
    autotune_trials: int = 10  # measured candidates, the starting options first
    autotune_seed: int = 0
    autotune_space: dict | None = None  # option -> "LOW:HIGH" (gradsched.tune.default_space)
    trace: str | None = None  # write a Chrome trace of this rank's run here (".rank{N}" is added)
    architecture: str = "allreduce"  # or "ps": the last ``servers`` ranks are parameter servers
    servers: int = 0  # ps only

    def __post_init__(self) -> None:
        if self.profile_rounds < 1:
            raise ValueError(f"profile_rounds must be >= 1, got {self.profile_rounds}")
        if self.replan_every < 0:
            raise ValueError(f"replan_every must be >= 0 (0: never), got {self.replan_every}")
        if self.trial_rounds < 3:
            raise ValueError(f"trial_rounds must be >= 3 (the first and last round of an arm are not measured), "
                             f"got {self.trial_rounds}")
        if self.autotune_trials < 2:
            raise ValueError(f"autotune_trials must be >= 2 (the starting options and a candidate), "
                             f"got {self.autotune_trials}")
        if not 0.0 <= self.fallback_gain < 1.0:
            raise ValueError(f"fallback_gain must be in [0, 1), got {self.fallback_gain}")
        if self.architecture not in ("allreduce", "ps"):
            raise ValueError(f"architecture must be 'allreduce' or 'ps', got {self.architecture!r}")
        if self.architecture == "ps" and self.servers < 1:
            raise ValueError(f"architecture='ps' needs servers >= 1, got {self.servers}")
        if self.architecture == "allreduce" and self.servers:
            raise ValueError("servers only apply to architecture='ps'")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")

    def fingerprint(self) -> dict:
        """What must be equal on every rank (the trace path may differ)."""
        data = dataclasses.asdict(self)
        data.pop("trace")
        return data
