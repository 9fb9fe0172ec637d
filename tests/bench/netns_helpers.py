"""Whether the emulated-cluster tests can run here, shared by the bench and multi-node tests."""

from __future__ import annotations

import functools
import os

import pytest

from gradsched.bench import available

HAVE_NETNS, WHY = available()
# CI runs as root, where namespaces must work: there a test that cannot make them fails
# instead of skipping silently (.ci/run sets this)
REQUIRED = os.environ.get("GRADSCHED_REQUIRE_NETNS") == "1"


def needs_netns(test):
    """Run ``test`` only where network namespaces can be made: skipped elsewhere, failed
    where they are required."""
    if HAVE_NETNS:
        return test
    if not REQUIRED:
        return pytest.mark.skip(reason=f"no network namespaces here: {WHY}")(test)

    @functools.wraps(test)
    def fail(*args, **kwargs):
        pytest.fail(f"GRADSCHED_REQUIRE_NETNS=1, but no network namespaces here: {WHY}")

    return fail
