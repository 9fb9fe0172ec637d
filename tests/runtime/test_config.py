"""wrap()'s options, validated once in RuntimeConfig: types, ranges, names."""

from __future__ import annotations

import pytest

from gradsched.runtime import RuntimeConfig


def test_defaults_and_keywords():
    config = RuntimeConfig.from_options({"replan_every": 0, "timeout": 5, "autotune_space": {"partition_bytes": "1:2"}})
    assert config.replan_every == 0 and config.timeout == 5 and config.fallback
    assert "trace" not in config.fingerprint() and "exit_server" not in config.fingerprint()


@pytest.mark.parametrize("options,error,match", [
    ({"replan_evry": 3}, TypeError, "unknown option 'replan_evry' .did you mean 'replan_every'"),
    ({"colour": "blue"}, TypeError, "unknown option 'colour'; options: find_unused_parameters"),
    ({"profile_rounds": "3"}, TypeError, "profile_rounds must be int, got '3'"),
    ({"profile_rounds": True}, TypeError, "profile_rounds must be int, got True"),
    ({"fallback": 1}, TypeError, "fallback must be bool, got 1"),
    ({"timeout": None}, TypeError, "timeout must be float"),
    ({"autotune_space": ["a"]}, TypeError, "autotune_space must be dict"),
    ({"profile_rounds": 0}, ValueError, "profile_rounds must be >= 1, got 0"),
    ({"trial_rounds": 2}, ValueError, "trial_rounds must be >= 3"),
    ({"timeout": 0}, ValueError, "timeout must be > 0"),
    ({"fallback_gain": 1.0}, ValueError, r"fallback_gain must be < 1"),
    ({"architecture": "ring"}, ValueError, "architecture must be 'allreduce', 'ps' or 'sharded'"),
    ({"architecture": "ps"}, ValueError, "needs servers >= 1, got 0"),
    ({"servers": 2}, ValueError, "servers only apply to architecture='ps'"),
])
def test_bad_options_say_what_to_fix(options, error, match):
    with pytest.raises(error, match=match):
        RuntimeConfig.from_options(options)
