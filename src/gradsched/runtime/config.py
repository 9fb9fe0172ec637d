"""The options of ``gradsched.wrap`` (all but the policy and its own options), documented
and validated here, once.

>>> RuntimeConfig.from_options({"replan_every": 20}).replan_every
20
>>> RuntimeConfig.from_options({"replan_evry": 20})
Traceback (most recent call last):
...
TypeError: gradsched.wrap() got an unknown option 'replan_evry' (did you mean 'replan_every'?)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Mapping

from gradsched.runtime.errors import entry


@dataclass(frozen=True)
class Environment:
    """Everything gradsched reads from the process environment, read here and nowhere else."""

    policy: str | None  # GRADSCHED_POLICY: DistributedDataParallel's policy where none is passed
    ordered_completion: bool  # GRADSCHED_ORDERED_COMPLETION=1: the CUDA path's completion threads on CPU too (tests)
    ps_piece_bytes: int | None  # GRADSCHED_PS_PIECE_BYTES: servers answer in pieces of this size (set alike
    #   on every rank; tests cut small messages)
    ddp_side_stream: bool  # PYTORCH_DDP_USE_SIDE_STREAM (DDP's own, default 1): inputs moved on a side stream
    emulate_nccl: tuple[float, float] | None = None  # GRADSCHED_EMULATE_NCCL=LATENCY[,DURATION] (seconds): CPU
    #   tensors get NCCL's completion semantics (gradsched.runtime.device.emulated; tests)
    cuda_max_connections: str | None = None  # CUDA_DEVICE_MAX_CONNECTIONS (CUDA's): 1 makes overlap impossible
    ranks_per_host: int = 1  # LOCAL_WORLD_SIZE (torchrun's): the ranks on this rank's host (1 where not set)

    @classmethod
    def read(cls) -> Environment:
        env = os.environ
        piece = env.get("GRADSCHED_PS_PIECE_BYTES")
        local = env.get("LOCAL_WORLD_SIZE", "")
        return cls(env.get("GRADSCHED_POLICY") or None, env.get("GRADSCHED_ORDERED_COMPLETION") == "1",
                   int(piece) if piece else None, env.get("PYTORCH_DDP_USE_SIDE_STREAM", "1") == "1",
                   _emulation(env.get("GRADSCHED_EMULATE_NCCL")), env.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                   int(local) if local.isdigit() and int(local) > 0 else 1)


def _emulation(value: str | None) -> tuple[float, float] | None:
    """``GRADSCHED_EMULATE_NCCL``: "LATENCY" or "LATENCY,DURATION", in seconds (None: not set).

    >>> _emulation("0.02"), _emulation("0.01,0.05"), _emulation(None)
    ((0.02, 0.0), (0.01, 0.05), None)
    """
    if not value:
        return None
    try:
        parts = [float(p) for p in value.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 2 or min(parts) < 0:
        raise ValueError(f"GRADSCHED_EMULATE_NCCL={value!r}: expected LATENCY or LATENCY,DURATION in seconds "
                         "(e.g. 0.02)")
    return parts[0], parts[1] if len(parts) > 1 else 0.0


#: options that existed once, and what to do instead
REMOVED = {"exit_server": "on a parameter-server rank wrap() serves until the workers are done and returns "
                          "(model, None); the script decides what its process does next"}


@dataclass(frozen=True)
class RuntimeConfig:
    """Every keyword option of ``gradsched.wrap``, with its default; the comment on each
    field is its documentation. Types and ranges are checked on construction, and every
    rank must pass the same values (``trace`` excepted)."""

    # -- what is communicated (as DDP's options of the same names) --
    find_unused_parameters: bool = False  # parameters may get no gradient in a backward pass: settled when it ends,
    #   as DDP (one small collective per backward pass); a parameter unused on every rank keeps its grad (None)
    #   and is not updated
    broadcast_buffers: bool = True  # copy rank 0's buffers (BatchNorm statistics) before a forward pass when the
    #   one before it trained and synced (and before the first): DDP's require_forward_param_sync rule
    broadcast_parameters: bool = False  # at wrap time, copy rank 0's parameters instead of requiring equal ones
    compression: str | None = None  # "bf16" or "fp16": every message travels in that dtype, divided by the
    #   number of workers, then cast (one cast per message), and cast back on arrival, as DDP's bf16/fp16
    #   compression hooks; the plans count wire bytes. None: gradients travel in their own dtype

    # -- plans --
    profile_rounds: int = 3  # backward passes measured (after the first) before the first measured plan
    replan_every: int = 50  # backward passes between later re-planning points; 0: never re-plan
    plan_on_slow_rank: bool = True  # while a rank is named slow (its backward pass; gradsched.control.ranks),
    #   rank 0 makes the plans on that rank's ready times, which every collective waits for; False: on its own
    fallback: bool = True  # measure the policy against DDP-style buckets (fifo) at the first control point and
    #   keep the buckets unless the policy is faster by fallback_gain (the buckets themselves measured 3-5%
    #   slower than DDP's C++ reducer on loopback: docs/bench.md, "Runtime overhead on loopback")
    fallback_gain: float = 0.02  # how much faster (a fraction) a choice must measure to replace another; a
    #   negative gain prefers the policy: it is kept unless it measures more than (1 - fallback_gain) times the
    #   buckets' iteration time (-99: kept unless 100x slower)
    handoff: bool = True  # where the measured trial keeps the buckets, hand the gradients to DDP's own C++
    #   reducer from the next step on (all-reduce only; runtime.handoff): DDP's speed, not gradsched's launcher's
    bucket_cap_mb: float = 25.0  # size cap (MiB) of the DDP-style buckets the fallback measures and keeps, as
    #   DDP's option of the same name (its first bucket is 1 MiB, as DDP's)
    trial_rounds: int = 5  # backward passes per measured arm (buckets, tuner candidates); the first and last
    #   of each arm are not counted
    trial_pairs: int = 2  # with fallback: interleaved pairs of arms (the policy, then the buckets) measured
    trial_extra_pairs: int = 2  # with fallback: pairs measured more, one at a time, where the pairs so far
    #   cannot tell the policy from the buckets (inside their noise, or disagreeing); after them the pooled mean
    #   of all pairs, and only where it cannot tell either, the simulator's prediction decides

    # -- online tuning (docs/tuning.md) --
    autotune: bool = False  # tune the policy's options (partition and credit sizes; Prophet's stage threshold)
    #   online by Bayesian optimisation: rank 0 proposes autotune_trials candidates (the starting options
    #   first), every rank switches at the same step, each is measured for trial_rounds backward passes, the
    #   fastest once more, and it is kept if the mean of its measurements beat the starting options by
    #   fallback_gain; optimizer.stats.autotune holds the history
    autotune_trials: int = 10  # measured candidates, the starting options first
    autotune_seed: int = 0  # seed of the tuner's sampler
    autotune_space: dict | None = None  # search ranges, option -> "LOW:HIGH" (e.g. {"partition_bytes":
    #   "256KiB:8MiB"}), replacing gradsched.tune.default_space's; without it sizes stay within 8x of the start

    # -- roles (docs/architectures.md, "Parameter servers") --
    architecture: str = "allreduce"  # or "ps": the last `servers` ranks are parameter servers; on a server rank
    #   wrap() serves until the workers close their optimizers, then returns (model, None); or "sharded": every
    #   rank owns 1/n of each parameter and of its optimizer state; or "fully_sharded": the parameters are
    #   also freed between uses (docs/architectures.md; checked, and built, by gradsched.runtime.architectures.choice)
    servers: int = 0  # parameter servers (architecture="ps" only)
    gather_budget_mb: float | None = None  # architecture="fully_sharded": MiB of whole parameters alive at
    #   once by its own choice (gathered ahead of need, kept from a forward pass for its backward); None: the
    #   largest module's own parameters (FSDP2's memory on a host: one module whole at a time)
    gradient_budget_mb: float | None = None  # architecture="sharded" or "fully_sharded": MiB this rank holds for
    #   gradients not yet reduced (whole local gradients waiting for their reduce-scatter, messages packed and in
    #   flight); past it a backward pass waits for the link before it computes more, and no plan's message
    #   carries more than half of it (ZeRO-2's memory, at the link's pace where the link is the slower);
    #   None: twice the largest gradient; float("inf"): no bound

    # -- failures and diagnostics --
    timeout: float = 300.0  # seconds after which a stuck or dead rank makes the others fail
    trace: str | None = None  # write a Chrome trace of this rank here (".rank{N}" is inserted) at close()

    def __post_init__(self) -> None:
        self._check_types()
        checks = [
            (self.profile_rounds >= 1, f"profile_rounds must be >= 1, got {self.profile_rounds}"),
            (self.replan_every >= 0, f"replan_every must be >= 0 (0: never), got {self.replan_every}"),
            (self.trial_rounds >= 3, "trial_rounds must be >= 3 (the first and last round of an arm are not "
                                     f"measured), got {self.trial_rounds}"),
            (self.trial_pairs >= 1, f"trial_pairs must be >= 1, got {self.trial_pairs}"),
            (self.trial_extra_pairs >= 0, f"trial_extra_pairs must be >= 0, got {self.trial_extra_pairs}"),
            (self.autotune_trials >= 2, "autotune_trials must be >= 2 (the starting options and a candidate), "
                                        f"got {self.autotune_trials}"),
            (self.fallback_gain < 1.0, f"fallback_gain must be < 1, got {self.fallback_gain}"),
            (self.timeout > 0, f"timeout must be > 0 seconds, got {self.timeout}"),
            (self.bucket_cap_mb > 0, f"bucket_cap_mb must be > 0, got {self.bucket_cap_mb}"),
            (self.gather_budget_mb is None or self.gather_budget_mb > 0,
             f"gather_budget_mb must be > 0 (or None), got {self.gather_budget_mb}"),
            (self.gradient_budget_mb is None or self.gradient_budget_mb > 0,
             f"gradient_budget_mb must be > 0 (or None), got {self.gradient_budget_mb}"),
            (self.compression in (None, "bf16", "fp16"),
             f"unknown compression {self.compression!r}; choose 'bf16', 'fp16' or None"),

        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def _check_types(self) -> None:
        accepted = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind, _, optional = f.type.partition(" | ")
            if value is None and optional == "None":
                continue
            kinds = accepted.get(kind, (dict,) if kind == "dict" else (object,))
            if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
                unit = " (seconds)" if f.name == "timeout" else ""
                raise TypeError(f"{entry()}: {f.name} must be {f.type}{unit}, got {value!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RuntimeConfig:
        """The configuration from ``wrap``'s keyword arguments; unknown names raise."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name in REMOVED:
                raise TypeError(f"{entry()}() no longer takes {name!r}: {REMOVED[name]}")
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; options: {', '.join(known)}"
                raise TypeError(f"{entry()}() got an unknown option {name!r}{hint}")
        return cls(**options)

    def fingerprint(self) -> dict:
        """What must be equal on every rank (where the trace goes may differ)."""
        data = dataclasses.asdict(self)
        data.pop("trace")
        return data
