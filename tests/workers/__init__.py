"""The programs the multi-process tests run on each rank, one module each, started by
:func:`workers.launch.run_ranks` (``python -m workers.NAME`` on every rank, as torchrun
would start them). The test that runs each one says what it checks."""
