"""The unittest class that runs PyTorch's DDP tests (the ported copy, :mod:`port`); imported
by :mod:`run`'s child process and by every rank it starts, with BACKEND and WORLD_SIZE set.

Upstream spawns each test's ranks as new interpreters, each importing torch and the tests
(seconds per rank). Here they are forked from a server that imported this module once
(multiprocessing's forkserver, this module preloaded): still new processes for every test,
with nothing of the test before them, and with the test's environment (upstream's setUp sets
TEMP_DIR per test), as a spawned rank inherits it."""

import os

import torch.multiprocessing as mp

from port import ported_module

_tests = ported_module()
_ranks = mp.get_context("forkserver")
_ranks.set_forkserver_preload(["suite"])


class _Rank(_ranks.Process):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.environ = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self.environ)
        super().run()


class Conformance(_tests.TestDistBackend, _tests.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(_Rank)  # upstream's _spawn_processes, from the server
