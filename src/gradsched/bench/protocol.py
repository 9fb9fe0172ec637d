"""How the runner and a benchmark rank talk: what every rank is told to run (a
:class:`WorkerConfig`, the worker's one argument), and how a rank reports (lines of JSON after
this marker on stdout)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .straggler import Straggler

MARK = "@@gradsched-bench "

# the phases a rank times besides the policies (keys of its ``host_cpu`` figures)
COMPUTE_ONLY = "compute only"
COMM_ONLY = "communication only"
COMM_WIRE = "communication only, compressed"  # the same bytes' buckets in the wire dtype (--compression)
SERVERS_ONLY = "communication only through the servers"


# -- what the runner tells every rank (the worker's one argument) ----------------------------------

CLIP, AUTOTUNE, SHARDED, FULLY = "clip", "autotune", "sharded", "fully_sharded"  # a run's variants, after a "+"


@dataclass(frozen=True)
class Run:
    """One measured run: a policy (or a DDP baseline), and its variant, as its row is named."""

    policy: str  # "ddp", "ddp-bf16", "fsdp2" (a baseline: see gradsched.bench.config.BASELINES), or a gradsched policy
    clip: float = 0.0  # > 0: clip gradients to this global norm ("+clip")
    autotune_trials: int = 0  # > 0: tuned online with this many candidates ("+autotune")
    sharded: bool = False  # architecture="sharded" ("+sharded")
    fully_sharded: bool = False  # architecture="fully_sharded" ("+fully_sharded")

    @property
    def name(self) -> str:
        return self.policy + (f"+{CLIP}" if self.clip else f"+{AUTOTUNE}" if self.autotune_trials
                              else f"+{SHARDED}" if self.sharded else f"+{FULLY}" if self.fully_sharded else "")

    @property
    def architecture(self) -> dict:
        """The architecture option of a gradsched run ({}: all-reduce, the default)."""
        return {"architecture": SHARDED} if self.sharded else {"architecture": FULLY} if self.fully_sharded else {}

    @property
    def is_ddp(self) -> bool:
        return self.policy.startswith("ddp")

    @property
    def is_fsdp(self) -> bool:
        return self.policy.startswith("fsdp2")


@dataclass(frozen=True)
class WorkerConfig:
    model: str
    batch: int
    device: str
    iters: int
    warmup: int
    runs: tuple[Run, ...]
    profile_rounds: int
    fallback: bool
    options: dict[str, dict] = field(default_factory=dict)  # policy -> its options
    arch: str = "allreduce"
    servers: int = 0  # parameter servers (the last ranks), with arch "ps"
    compression: str | None = None
    dilation: float = 1.0
    trace_dir: str | None = None
    straggler: Straggler | None = None  # one slow rank (gradsched.bench.straggler)
    plan_on_slow_rank: bool = True  # wrap's option of the same name

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["straggler"] = None if self.straggler is None else self.straggler.as_json()
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        data = json.loads(text)
        data["runs"] = tuple(Run(**run) for run in data["runs"])
        data["straggler"] = Straggler.from_json(data.get("straggler"))
        return cls(**data)
