"""The four scheduling policies, by name."""

from __future__ import annotations

from typing import Any

from ..base import PolicyConfig
from .bytescheduler import ByteSchedulerConfig
from .fifo import FifoConfig
from .priority import PriorityConfig
from .prophet import ProphetConfig

POLICIES: dict[str, type[PolicyConfig]] = {
    cls.name: cls for cls in (FifoConfig, PriorityConfig, ByteSchedulerConfig, ProphetConfig)
}


def is_buckets(name: str) -> bool:
    """Whether the policy named ``name`` is DDP's own buckets scheme (see ``PolicyConfig.is_buckets``)."""
    return name in POLICIES and POLICIES[name].is_buckets


def policy_config(name: str, **overrides: Any) -> PolicyConfig:
    """The default config of policy ``name``, with ``overrides`` applied (strings parsed).

    >>> policy_config("bytescheduler", credit_bytes="32MiB").credit_bytes
    33554432
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; choose from: {', '.join(POLICIES)}")
    return cls().with_overrides(**overrides) if overrides else cls()


__all__ = ["POLICIES", "policy_config", "FifoConfig", "PriorityConfig", "ByteSchedulerConfig", "ProphetConfig"]
