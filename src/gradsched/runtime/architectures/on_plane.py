"""The architectures that reduce on gradsched's own data plane (every one a user names): their
backend is the plane (:class:`~gradsched.runtime.training.plane.Plane`), built over the run's
record, which asks the architecture for the rest in the order the interface's docstring gives
(:mod:`gradsched.runtime.training.architecture`)."""

from __future__ import annotations

from gradsched.runtime.training.architecture import Architecture
from gradsched.runtime.training.plane import Plane
from gradsched.runtime.training.run import Run


class OnDataPlane(Architecture):
    def open(self, run: Run) -> Plane:
        return Plane(run, self)
