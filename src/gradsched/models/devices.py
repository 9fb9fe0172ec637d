"""Device presets that turn FLOP and byte counts into compute times.

The figures are ASSUMED sustained rates for training (not datasheet peaks), chosen so that
FLOP-based estimates land near commonly reported training throughputs; they are stated
here so every simulated result can be traced to them. Use a measured JSON profile when
you have one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    tflops: float  # sustained matmul/convolution throughput, TFLOP/s
    memory_gbs: float  # sustained memory bandwidth for element-wise layers, GB/s
    launch_s: float  # fixed cost per layer per pass (kernel launches, framework overhead)
    note: str

    @property
    def cast_s_per_byte(self) -> float:
        """Compression's cast to a 2-byte wire dtype, per wire byte: a memory-bound copy that
        reads 4 bytes and writes 2 per element, so 3 bytes moved per wire byte (and as many
        casting back)."""
        return 3.0 / (self.memory_gbs * 1e9)

    def __post_init__(self) -> None:
        if self.tflops <= 0 or self.memory_gbs <= 0 or self.launch_s < 0:
            raise ValueError(f"device {self.name!r}: rates must be > 0 and launch cost >= 0")


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("v100", 12.0, 750.0, 10e-6, "V100, FP32 training (~77% of the 15.7 TFLOP/s peak)"),
        Device("a100", 60.0, 1500.0, 8e-6, "A100, mixed precision training (~19% of the 312 TFLOP/s peak)"),
        Device("h100", 150.0, 2600.0, 6e-6, "H100 SXM, mixed precision training (~15% of the 989 TFLOP/s peak)"),
    )
}


def get_device(name: str) -> Device:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; choose from: {', '.join(DEVICES)}") from None
