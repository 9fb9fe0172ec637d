"""The runtime's control plane, free of torch, threads and clocks: when control points
happen (:mod:`~gradsched.control.schedule`), the measured-arms experiment that decides
which plan a run keeps (:mod:`~gradsched.control.arms`), and which rank is slow
(:mod:`~gradsched.control.ranks`). The runtime feeds both with
round numbers and measured times and adopts what they decide."""

from .arms import Arm, ArmKind, ArmsExperiment, Decision, TrialReport, TuningReport, arm_kinds
from .schedule import ControlPoint, ControlSchedule, Stage

__all__ = ["Arm", "ArmKind", "ArmsExperiment", "ControlPoint", "ControlSchedule", "Decision", "Stage", "TrialReport",
           "TuningReport", "arm_kinds"]
