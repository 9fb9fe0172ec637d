"""Architectures: the ways gradients are averaged over the ranks, each one object behind one
interface (:mod:`~gradsched.runtime.training.architecture`), chosen once per wrap by
:func:`~gradsched.runtime.architectures.choice.choose`:

* :mod:`~gradsched.runtime.architectures.allreduce`: all-reduce among the workers (the default);
* :mod:`~gradsched.runtime.architectures.servers`: parameter servers;
* :mod:`~gradsched.runtime.architectures.sharded`: every rank owns 1/n of each parameter and
  of its optimizer state;
* :mod:`~gradsched.runtime.architectures.reducer`: DDP's own reducer, which all-reduce hands
  its kept buckets to (the hand-off swaps the architecture).

This package's own module loads nothing: the training thread's objects import the interface
(``base``), and the architectures build on them.
"""
