"""The scheduler core: tasks, the engine and the policies. No torch, no threads, no clock."""

from .base import FlowControl, Ordering, Partitioner, Policy, PolicyConfig
from .engine import Decision, Scheduler, SchedulerError
from .estimator import LinkEstimator, MeasuredLink
from .policies import POLICIES, policy_config
from .stages import Stage, StagePlan, detect_stages
from .task import CommTask, Message, TaskState, TensorSpec

__all__ = [
    "CommTask",
    "Decision",
    "FlowControl",
    "LinkEstimator",
    "MeasuredLink",
    "Message",
    "Ordering",
    "POLICIES",
    "Partitioner",
    "Policy",
    "PolicyConfig",
    "Scheduler",
    "SchedulerError",
    "Stage",
    "StagePlan",
    "TaskState",
    "TensorSpec",
    "detect_stages",
    "policy_config",
]
