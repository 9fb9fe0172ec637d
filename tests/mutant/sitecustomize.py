"""Planted defects, applied at interpreter start-up where ``GRADSCHED_MUTANT`` names one and this
folder is on ``PYTHONPATH`` (so in every rank a test starts, spawned ones included).

``early-resolve``: a completion that ignores its futures and events, resolving each message
as soon as it is launched: gradients count as reduced before their results are in place.
The GPU check's reduction rows over a slow link must fail on it (tests/bench/test_gpu_check.py).

``skipped-wait``: a consumer that skips its event wait (``Exchange.order_after`` queues no wait):
reduced gradients are read as soon as their message is resolved. ``done-is-reduced``: a
completion that takes a future that is done for a message that is reduced (resolved with no
event behind it). Both are right on gloo, where a future is done once reduced, and wrong on
NCCL, where it is done once queued: the equality tests under the emulated NCCL must fail on
them, and do (tests/distributed/test_nccl_semantics.py).

``grad-at-apply``: a deferred update that reads ``.grad`` when it is applied (in the module's next
forward pass), not the gradient ``step()`` was called on: what gradsched did before the
differential tests (tests/distributed/test_differential.py) found that ``model.zero_grad()`` or
``p.grad = None`` after ``step()`` loses the update, and the generated programs must fail on it.

``copy-back-returns-nothing``: the copy back of a message that travelled in a temporary buffer
returns None, as it did before issue 54: on CUDA its future then records no event (c10 records
events for the devices of the tensors a future's value holds), so nothing orders a consumer
after the copy. The emulated NCCL must catch it (tests/distributed/test_nccl_semantics.py).
``producer-unwaited``: the launcher packs a message without waiting for the events where its
gradients were produced. ``released-early``: the launcher lets go of a packed message's buffer
once it is issued, before the copy back read it (the caching allocator hands such memory to
the next allocation). Both right on gloo; the emulation must catch them.
``gather-released-early``: sharding's all-gather on NCCL's path (a buffer, copied into the
parameters by a callback) lets go of its buffer once issued, before the callback read it: the
emulation must catch it (gloo takes the point-to-point path, with no buffer).

``no-reduction``:
every architecture's transport (all-reduce, push and pull to parameter servers, the sharded
reduce-scatter) hands each rank's own gradients back as if reduced (no division, no
collective), and kept buckets are never handed to DDP's reducer: a gradsched that trains each
rank alone. A test suite that still passes against it guards nothing about
reduction; docs/conformance.md says which of PyTorch's DDP tests do, and the project's own
equality tests must fail on it (tests/test_mutant.py).
"""

import os

if os.environ.get("GRADSCHED_MUTANT") == "no-reduction":
    import torch

    from gradsched.runtime.architectures import allreduce
    from gradsched.runtime.architectures.servers import pushpull
    from gradsched.runtime.architectures.sharded import shards
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

    for kind in (transport.AllReduce, pushpull.PushPull, shards.ReduceScatter):
        kind.divide = _own
        kind.send = _returned
    allreduce.AllReduce.handed_off = lambda self, config, workers: None

if os.environ.get("GRADSCHED_MUTANT") == "early-resolve":
    from gradsched.runtime.comm import completion

    def _resolved_at_once(track):
        def early(self, futures, resolved, finished):
            resolved(None)  # before anything completed
            track(self, futures, lambda event: None, finished)

        return early

    completion.CallbackCompletion.track = _resolved_at_once(completion.CallbackCompletion.track)
    completion.OrderedCompletion.track = _resolved_at_once(completion.OrderedCompletion.track)

if os.environ.get("GRADSCHED_MUTANT") == "skipped-wait":
    from gradsched.runtime.comm import exchange

    def _not_ordered(self, indices):
        """A consumer that skips its event wait: reduced gradients read as soon as resolved."""
        return 0

    exchange.Exchange.order_after = _not_ordered

if os.environ.get("GRADSCHED_MUTANT") == "done-is-reduced":
    import time

    from gradsched.runtime.comm import completion

    def _done_is_reduced(self, futures, resolved, finished):
        """A completion that takes a future that is done for a message that is reduced: resolved
        with no event behind it (on gloo that holds; on NCCL a future is done once queued)."""
        while not all(f.done() for f in futures):
            time.sleep(1e-4)
        resolved(None)
        self._ended.put((self.device.record(), finished, None))

    completion.OrderedCompletion._resolve_one = _done_is_reduced

if os.environ.get("GRADSCHED_MUTANT") == "grad-at-apply":
    from gradsched.runtime.training import inflight, updates

    class _AtApply:
        """Stands for ``.grad`` as it is when the action is applied."""

        def __init__(self, param):
            self.param = param

    def _enqueue_late(self, i, action):
        self.queue.setdefault(i, []).append((action, _AtApply(self.params[i])))

    def _late_plain(t):
        return inflight.plain(t.param.grad) if isinstance(t, _AtApply) else inflight.plain(t)

    updates.DeferredUpdates._enqueue = _enqueue_late
    updates.plain = _late_plain

if os.environ.get("GRADSCHED_MUTANT") == "copy-back-returns-nothing":
    from gradsched.runtime.comm import launcher

    _copy_back = launcher._copy_back

    def _returns_nothing(result, views, future):
        _copy_back(result, views, future)

    launcher._copy_back = _returns_nothing

if os.environ.get("GRADSCHED_MUTANT") == "producer-unwaited":
    from gradsched.runtime.comm import launcher

    _launch = launcher.Launcher._launch

    def _unwaited(self, state, k, message, grads, idle, produced):
        _launch(self, state, k, message, grads, idle, [])  # no producer's event to wait for

    launcher.Launcher._launch = _unwaited

if os.environ.get("GRADSCHED_MUTANT") == "released-early":
    from gradsched.runtime.comm import launcher

    launcher.RoundState.hold = lambda self, k, buffers: None  # the packed buffers not kept until the message ends

if os.environ.get("GRADSCHED_MUTANT") == "gather-released-early":
    from gradsched.runtime.architectures.sharded import shards

    _gathered_init = shards.Gathered.__init__

    def _let_go(self, future, buffer=None):
        _gathered_init(self, future, None)  # the buffer an all-gather went through not kept until waited for

    shards.Gathered.__init__ = _let_go
