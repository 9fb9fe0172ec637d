"""Where a rank's gradients live, and how work on them is ordered: the one object the data
plane asks (:class:`~gradsched.runtime.device.base.Device`), chosen once per wrap by
:func:`device_for`.

* :class:`~gradsched.runtime.device.host.HostDevice`: CPU tensors on gloo; nothing to order;
* :class:`~gradsched.runtime.device.cuda.CudaDevice`: CUDA streams and events, streams of
  gradsched's own;
* :class:`~gradsched.runtime.device.emulated.EmulatedNccl`: CPU tensors with NCCL's
  completion semantics emulated, for tests (``GRADSCHED_EMULATE_NCCL``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from gradsched.runtime.config import Environment
from gradsched.runtime.device.base import Device, Produced, future_of, latest_per_stream
from gradsched.runtime.device.cuda import CudaDevice
from gradsched.runtime.device.emulated import EmulatedNccl
from gradsched.runtime.device.host import HostDevice

__all__ = ["Device", "HostDevice", "Produced", "device_for", "future_of", "latest_per_stream"]


def device_for(tensors: Sequence[torch.Tensor], environment: Environment, timeout_s: float) -> Device:
    """The device of a rank whose gradients are like ``tensors``: CUDA where any is on a GPU;
    else the emulated NCCL where the environment asks for it; else the host."""
    cuda = next((t.device for t in tensors if t.is_cuda), None)
    if cuda is not None:
        return CudaDevice(cuda, environment.cuda_max_connections)
    if environment.emulate_nccl is not None:
        latency, duration = environment.emulate_nccl
        return EmulatedNccl(latency, duration, timeout_s)
    return HostDevice()
