"""What a benchmark measures: :class:`BenchConfig` (every option of ``gradsched bench``, checked
once) and the DDP and FSDP2 baselines it can measure beside gradsched's policies."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import POLICIES, policy_config
from ..core.architectures import KINDS, kind
from .dilation import check_dilation
from .netns import JUMBO_MTU
from .protocol import Run
from .straggler import Straggler
from .workloads import workload

# ddp-bf16/-fp16: DDP with a compression hook; ddp-zero: DDP with torch's ZeroRedundancyOptimizer;
# fsdp2: torch's fully_shard per layer (its default, resharding after forward), fsdp2-noreshard:
# reshard_after_forward=False (ZeRO-2-like)
FSDP2 = {"fsdp2": True, "fsdp2-noreshard": False}  # -> reshard_after_forward
BASELINES = ("ddp", "ddp-tuned", "ddp-bf16", "ddp-fp16", "ddp-zero", *FSDP2)


#: what --arch names (the sharded ones run as extra rows beside all-reduce: --sharded, --fully-sharded)
BENCH_ARCHITECTURES = tuple(k.name for k in KINDS if not k.phases)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "mlp"
    workers: int = 2
    bandwidths_bps: tuple[float | None, ...] = (5e9,)  # None: no limit
    latency_s: float = 0.0
    policies: tuple[str, ...] = ("ddp", "fifo", "priority", "bytescheduler", "prophet")
    iters: int = 30
    warmup: int = 5
    batch: int = 32
    device: str = "v100"
    profile_rounds: int = 3
    trace_dir: str | None = None
    timeout_s: float = 1800.0
    loopback: bool = False  # force loopback (no namespaces, no limit)
    fallback: bool = True  # let gradsched fall back to DDP-style buckets where predicted better
    options: tuple[tuple[str, str, str], ...] = ()  # (policy, option, value), as --set gives them
    arch: str = "allreduce"  # or "ps": ``servers`` more ranks, each in its own namespace
    servers: int = 0
    autotune_trials: int = 0  # > 0: each tunable policy also runs as "POLICY+autotune"
    clip: float = 0.0  # > 0: ddp and each policy also run clipping gradients to this global norm ("+clip" rows)
    sharded: bool = False  # each gradsched policy also runs with architecture="sharded" ("+sharded" rows)
    fully_sharded: bool = False  # ... and with architecture="fully_sharded" ("+fully_sharded" rows)
    compression: str | None = None  # "bf16"/"fp16": gradsched's policies run with wrap(compression=...)
    procs_per_node: int = 1  # ranks per emulated host (a namespace, one tc-limited link shared by its ranks)
    launcher: str = "direct"  # "direct": the runner starts every rank; "torchrun": one torchrun per host
    balance: bool = False  # measure at the bandwidth where compute and communication are equal, found
    #   by calibration runs starting from bandwidths_bps[0]
    dilation: float | str = 1.0  # time dilation K (gradsched.bench.dilation), or "auto"
    mtu: int = JUMBO_MTU  # frame size on the emulated links (gradsched.bench.netns)
    straggler: Straggler | None = None  # one slow worker: its compute or its link, throughout or in bursts
    plan_on_slow_rank: bool = True  # gradsched's runs: plans on a slow rank's ready times (wrap's option)

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(f"workers must be >= 2 (communication needs two), got {self.workers}")
        if self.arch not in BENCH_ARCHITECTURES:
            raise ValueError(f"arch must be {' or '.join(BENCH_ARCHITECTURES)}, got {self.arch!r} (the sharded "
                             "architectures run beside all-reduce: --sharded, --fully-sharded)")
        if kind(self.arch).servers:
            if self.servers < 1:
                raise ValueError(f"--arch ps needs --servers >= 1, got {self.servers}")
            baselines = [p for p in self.policies if p in BASELINES]
            if baselines:
                raise ValueError(f"{', '.join(baselines)} use all-reduce; with --arch ps the reference is the fifo "
                                 "policy over the servers: drop them from --policy")
        elif self.servers:
            raise ValueError("--servers only applies to --arch ps")
        if (self.sharded or self.fully_sharded) and kind(self.arch).servers:
            raise ValueError("--sharded and --fully-sharded run beside all-reduce: drop --arch ps")
        if isinstance(self.procs_per_node, bool) or not isinstance(self.procs_per_node, int) \
                or self.procs_per_node < 1:
            raise ValueError(f"--procs-per-node must be a whole number >= 1, got {self.procs_per_node!r}")
        if self.ranks % self.procs_per_node:
            raise ValueError(f"{self.ranks} ranks do not fill hosts of {self.procs_per_node} processes")
        if self.launcher not in ("direct", "torchrun"):
            raise ValueError(f"launcher must be direct or torchrun, got {self.launcher!r}")
        if self.iters < 3 or self.warmup < 0:
            raise ValueError(f"iters must be >= 3 and warmup >= 0, got {self.iters} and {self.warmup}")
        unknown = [p for p in self.policies if p not in BASELINES]
        for name in unknown:
            policy_config(name, **self.policy_options(name))  # raises for unknown policies and options
        for policy, _, _ in self.options:
            if policy not in self.policies or policy in BASELINES:
                raise ValueError(f"--set {policy}.*: {policy!r} is not a gradsched policy being measured")
        if not self.policies:
            raise ValueError("no policy to measure")
        if self.balance and (len(self.bandwidths_bps) != 1 or self.bandwidths_bps[0] is None or self.loopback):
            raise ValueError("--balance finds one bandwidth on the emulated network, starting from --bandwidth: "
                             "drop --sweep-bandwidth and --loopback")
        if self.compression not in (None, "bf16", "fp16"):
            raise ValueError(f"--compression must be bf16 or fp16, got {self.compression!r}")
        if isinstance(self.mtu, bool) or not isinstance(self.mtu, int) or not 576 <= self.mtu <= 65535:
            raise ValueError(f"--mtu must be a frame size in 576..65535 bytes, got {self.mtu!r}")
        if not self.clip >= 0:
            raise ValueError(f"--clip must be a norm >= 0 (0: no clipping rows), got {self.clip}")
        if self.autotune_trials == 1 or self.autotune_trials < 0:
            raise ValueError(f"--autotune needs >= 2 trials (the defaults and a candidate), got {self.autotune_trials}")
        replay = workload(self.model, self.batch, self.device).replay  # unknown models raise
        check_dilation(self.dilation, replay)
        if self.straggler is not None:
            self.straggler.check(self.workers, replay, self.iters)
            if self.straggler.link and (self.loopback or None in self.bandwidths_bps):
                raise ValueError("--straggler ...:link slows a tc-limited link: give --bandwidth (no 'none' in a "
                                 "sweep) and drop --loopback")
            if self.straggler.link_bursts and self.with_servers:
                raise ValueError("--straggler ...:link:burst=S/P is measured among all-reduce workers: without "
                                 "--arch ps (communication only through the servers is not timed in bursts)")

    @property
    def straggling(self) -> float:
        """How many times slower the slowest worker computes, on average (1: none is slower, or
        only its link is): every collective waits for it, so it sets the compute the others see
        (the bound, the predictions)."""
        s = self.straggler
        return 1.0 if s is None or s.link else s.mean_factor

    @property
    def with_servers(self) -> bool:
        """Parameter servers (``--arch ps``): the reference is fifo through them, not DDP."""
        return self.servers > 0

    @property
    def ranks(self) -> int:
        return self.workers + self.servers

    @property
    def hosts(self) -> int:
        """Emulated hosts: rank r runs on host r // procs_per_node."""
        return self.ranks // self.procs_per_node

    @property
    def runs(self) -> list[Run]:
        """What is measured, in order: each policy, followed by its autotuned run, its run with
        clipping and its sharded runs (each row is named for its run: ``Run.name``)."""
        from ..tune.space import DEFAULT_RANGES

        runs = []
        for policy in self.policies:
            runs.append(Run(policy))
            if self.autotune_trials and policy in DEFAULT_RANGES:
                runs.append(Run(policy, autotune_trials=self.autotune_trials))
            if self.clip and policy in ("ddp", *POLICIES):
                runs.append(Run(policy, clip=self.clip))
            if self.sharded and policy in POLICIES:
                runs.append(Run(policy, sharded=True))
            if self.fully_sharded and policy in POLICIES:
                runs.append(Run(policy, fully_sharded=True))
        return runs

    def run_named(self, name: str) -> Run:
        """The run a row (a rank's result) is named for."""
        return next(run for run in self.runs if run.name == name)

    @property
    def phases(self) -> int:
        """Measured phases per bandwidth: every run, then the baselines (computing only,
        communicating only, and through the servers with parameter servers)."""
        return len(self.runs) + (3 if self.with_servers else 2)

    @property
    def reference(self) -> str:
        """What speed-ups are measured against."""
        return "fifo" if self.with_servers else "ddp"

    def policy_options(self, policy: str) -> dict[str, str]:
        return {option: value for name, option, value in self.options if name == policy}
