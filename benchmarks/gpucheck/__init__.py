"""The GPU check's parts, one module each (the check itself: benchmarks/gpu_check.py).

Each part is a function ``part(device, quick) -> rows`` run by every rank of a fresh set of
processes (:mod:`gpucheck.processes`); a row is a check with a verdict (:func:`gpucheck.common.row`)."""
