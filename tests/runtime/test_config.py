"""wrap()'s options, validated once in RuntimeConfig: types, ranges, names."""

from __future__ import annotations

import pytest

from gradsched.runtime import RuntimeConfig
from gradsched.runtime.architectures.choice import NAMES, choose


def test_defaults_and_keywords():
    config = RuntimeConfig.from_options({"replan_every": 0, "timeout": 5, "autotune_space": {"partition_bytes": "1:2"}})
    assert config.replan_every == 0 and config.timeout == 5 and config.fallback
    assert "trace" not in config.fingerprint()


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
    ({"exit_server": False}, TypeError, "no longer takes 'exit_server': .* returns .model, None.; the script decides"),
])
def test_bad_options_say_what_to_fix(options, error, match):
    with pytest.raises(error, match=match):
        RuntimeConfig.from_options(options)


@pytest.mark.parametrize("options,match", [
    ({"architecture": "ring"}, "architecture must be 'allreduce', 'ps', 'sharded' or 'fully_sharded', got 'ring'"),
    ({"architecture": "ps"}, "needs servers >= 1, got 0"),
    ({"servers": 2}, "servers only apply to architecture='ps'"),
])
def test_the_architecture_is_checked_where_it_is_chosen(options, match):
    with pytest.raises(ValueError, match=match):
        choose(RuntimeConfig.from_options(options))


def test_each_name_builds_its_architecture():
    built = {name: choose(RuntimeConfig.from_options({"architecture": name, "servers": 2 if name == "ps" else 0}))
             for name in NAMES}
    assert {name: a.name for name, a in built.items()} == {name: name for name in NAMES}
    assert built["ps"].servers == 2 and built["ps"].link_model().sim == "ps"
    assert built["allreduce"].link_model().probed and not built["sharded"].link_model().probed
