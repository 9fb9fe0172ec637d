"""Every part of the GPU check, in the order it runs (the most telling first: a run cut short by
its budget keeps those), with the time each may take on the lent GPU."""

from __future__ import annotations

from gpucheck.common import Part
from gpucheck.end_to_end import part_end_to_end
from gpucheck.handoff import part_handoff
from gpucheck.host_syncs import part_host_syncs
from gpucheck.nccl import EMULATION, part_nccl
from gpucheck.overhead import part_overhead
from gpucheck.overlap import part_overlap, part_steady
from gpucheck.profile import part_profile
from gpucheck.reduction import part_reduction
from gpucheck.sharded import part_sharded
from gpucheck.streams import part_streams
from gpucheck.sync_bn import part_sync_bn

PARTS = {
    "nccl": Part(part_nccl, 1, "nccl", 60, EMULATION),
    "reduction": Part(part_reduction, 2, "gloo", 90),
    "streams": Part(part_streams, 1, "nccl", 30),
    "handoff": Part(part_handoff, 2, "gloo", 60),
    "steady": Part(part_steady, 1, "nccl", 60),
    "overlap": Part(part_overlap, 1, "nccl", 60),
    "sync_bn": Part(part_sync_bn, 2, "gloo", 45),
    "sharded": Part(part_sharded, 1, "nccl", 60, EMULATION),
    "end_to_end": Part(part_end_to_end, 1, "nccl", 90),
    "profile": Part(part_profile, 1, "nccl", 30),
    "host_syncs": Part(part_host_syncs, 1, "nccl", 30),
    "overhead": Part(part_overhead, 1, "nccl", 90),
}
