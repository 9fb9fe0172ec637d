"""The simulator's prediction of a measured trial (the policy against DDP-style buckets, on the
probed link or the estimate from completed messages), made at the first control point and
reported next to the measurement; it does not decide (:mod:`gradsched.runtime.planning.planner`)."""

from __future__ import annotations

from typing import Mapping, Sequence

from gradsched.core.base import PolicyConfig
from gradsched.core.estimator import MeasuredLink
from gradsched.core.policies import FifoConfig
from gradsched.core.task import TensorSpec
from gradsched.models.table import ModelTable
from gradsched.runtime.comm.compression import wire_dtype
from gradsched.runtime.planning.link_model import LinkModel
from gradsched.runtime.comm.exchange import Exchange
from gradsched.runtime.config import RuntimeConfig
from gradsched.runtime.diagnostics.stats import Prediction
from gradsched.runtime.planning.profiling import RoundTiming, measured_table
from gradsched.sim.predict import predict, ring_cluster


def ddp_buckets(tensors: Sequence[TensorSpec], param_bytes: int, config: RuntimeConfig) -> FifoConfig:
    """The buckets of ``bucket_cap_mb`` that DDP (with a compression hook, if compressed) would
    send, as a plan over ``tensors`` (wire bytes) counts them; ``param_bytes``: the gradients'
    bytes in the parameters' own dtype."""
    wire_ratio = sum(t.nbytes for t in tensors) / param_bytes
    return FifoConfig.ddp_buckets(int(config.bucket_cap_mb * (1 << 20)), wire_ratio)


class TrialPredictor:
    def __init__(self, tensors: Sequence[TensorSpec], sizes: Mapping[str, tuple[int, int]],
                 owners: Mapping[str, list[str]], policy: PolicyConfig, config: RuntimeConfig,
                 link_model: LinkModel, world_size: int, exchange: Exchange) -> None:
        """``sizes``: tensor -> (elements, bytes each) of the parameter; ``owners``: module ->
        the parameters its forward waits for (kept up to date by the planner)."""
        self.tensors, self.sizes, self.owners = tensors, sizes, owners
        self.policy, self.config, self.world_size, self.exchange = policy, config, world_size, exchange
        self.link_model = link_model

    def buckets(self) -> FifoConfig:
        """The DDP-style buckets the fallback measures (:func:`ddp_buckets`)."""
        return ddp_buckets(self.tensors, sum(n * size for n, size in self.sizes.values()), self.config)

    def prediction(self, timings: list[RoundTiming], link: tuple, probed: MeasuredLink | None) -> Prediction | None:
        """The simulator's view of the measured trial, on the probed link (or the estimate)."""
        if not (self.config.fallback and self.link_model.probed and link and timings):
            return None
        # probed: with compression, in the wire dtype, and the casts' cost
        return self._predict(timings, probed is not None, *((probed.latency_s, probed.seconds_per_byte, probed.overhead_s,
                                         probed.cast_s_per_byte) if probed else link))

    def estimated_link(self) -> tuple[float, float, float] | tuple[()]:
        """(latency, seconds per byte, per-message overhead) estimated from completed
        messages, () before any; with parameter servers, of one direction (push or pull)."""
        est = self.exchange.estimator
        if not (est.ready and est.seconds_per_byte > 0):
            return ()
        return self.link_model.link(est.latency, est.seconds_per_byte, est.per_message)

    def _predict(self, timings: list[RoundTiming], probed: bool, latency: float, per_byte: float,
                 overhead: float, cast: float = 0.0) -> Prediction | None:
        """Simulate the measured model under the policy and under fifo on the measured link.

        When the measured messages were all about one size, per-message and per-byte costs
        cannot be told apart: then the policy must win under both attributions (all of a
        message's time per byte, and all of it per message) or the prediction says buckets."""
        table = measured_table(timings, self.owners, self.sizes)
        if table is None:
            return None
        wire = wire_dtype(self.config.compression)
        if wire is not None:  # the measured table has the parameters' own sizes; messages carry wire bytes
            table = table.on_the_wire(wire.itemsize)
        links = [(latency, per_byte, overhead, cast)]
        estimator = self.exchange.estimator
        if not probed and not estimator.separable:
            _, seconds = estimator.mean_queued
            links.append((latency, per_byte * 1e-3, seconds, cast))  # (almost) everything per message
        verdicts = [self._simulate_both(table, *attribution) for attribution in links]
        ours, fifo = verdicts[0]
        use_fifo = any(o > f * (1.0 - self.config.fallback_gain) for o, f in verdicts)
        return Prediction(table.compute_s, latency, overhead, table.gradient_bytes * per_byte, ours, fifo,
                          separable=len(links) == 1, use_fifo=use_fifo)

    def _simulate_both(self, table: ModelTable, latency: float, per_byte: float, overhead: float,
                       cast: float) -> tuple[float, float]:
        cluster = ring_cluster(self.world_size, per_byte, latency, overhead, cast_s_per_byte=cast)
        return predict(table, cluster, self.policy), predict(table, cluster, self.buckets())
