"""The unittest class that runs PyTorch's DDP tests (the ported copy, :mod:`port`); imported
by :mod:`run`'s child process and by every rank it spawns, with BACKEND and WORLD_SIZE set."""

from port import ported_module

_tests = ported_module()


class Conformance(_tests.TestDistBackend, _tests.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
