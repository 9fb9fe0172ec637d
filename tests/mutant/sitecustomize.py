"""Planted defects, applied at interpreter start-up where ``GRADSCHED_MUTANT`` names one and this
folder is on ``PYTHONPATH`` (so in every rank a test starts, spawned ones included).

``early-resolve``: a completion that ignores its futures and events, resolving each message
as soon as it is launched: gradients count as reduced before their results are in place.
The GPU check's reduction rows over a slow link must fail on it (tests/bench/test_gpu_check.py).

``no-reduction``:
gradsched's all-reduce transport hands each rank's own gradients back as if reduced (no
division, no collective), and kept buckets are never handed to DDP's reducer: a gradsched that
trains each rank alone. A test suite that still passes against it guards nothing about
reduction; docs/conformance.md says which of PyTorch's DDP tests do, and the project's own
equality tests must fail on it (tests/test_mutant.py).
"""

import os

if os.environ.get("GRADSCHED_MUTANT") == "no-reduction":
    import torch

    from gradsched.runtime.training import coordinator
    from gradsched.runtime.comm import transport

    def _own(self, buffers):
        """Nothing to divide: each rank keeps its own."""

    def _returned(self, key, buffers, on_sent=None):
        futures = []
        for buffer in buffers:
            future = torch.futures.Future()
            future.set_result([buffer])
            futures.append(future)
        return futures

    transport.AllReduce.divide = _own
    transport.AllReduce.send = _returned
    coordinator.hands_off = lambda config, workers: False

if os.environ.get("GRADSCHED_MUTANT") == "early-resolve":
    from gradsched.runtime.comm import completion

    def _resolved_at_once(track):
        def early(self, futures, resolved, finished):
            resolved(None)  # before anything completed
            track(self, futures, lambda event: None, finished)

        return early

    completion.CallbackCompletion.track = _resolved_at_once(completion.CallbackCompletion.track)
    completion.OrderedCompletion.track = _resolved_at_once(completion.OrderedCompletion.track)
