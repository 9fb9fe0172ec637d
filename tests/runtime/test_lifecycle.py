"""The life of a round (gradsched.runtime.training.lifecycle), as exact traces: what a training
loop's calls make of it, in the order the plane sees them."""

from __future__ import annotations

import pytest

from gradsched.runtime.training.lifecycle import Phase, RoundLife


def _loop(life: RoundLife, gradients: int = 3) -> list[bool]:
    """forward, backward (``gradients`` handed over), step: what each gradient said."""
    if life.close():
        life.orphans_due()
    life.forward()
    opened = [life.gradient() for _ in range(gradients)]
    life.close()
    life.orphans_due()
    life.stepped()
    return opened


def test_a_training_loop():
    trace: list[str] = []
    life = RoundLife(trace)
    assert life.phase is Phase.IDLE and life.index == 0 and life.close() is False
    assert _loop(life) == [True, False, False]  # the first gradient opens round 1, the others join it
    assert _loop(life, 2) == [True, False]
    assert trace == ["forward: round 0 forward", "gradient: round 1 open", "close: round 1 closed",
                     "stepped: round 1 stepped",
                     "forward: round 1 forward", "gradient: round 2 open", "close: round 2 closed",
                     "stepped: round 2 stepped"]


def test_the_next_forward_closes_a_round_no_step_followed_and_orphans_are_looked_for_once():
    life = RoundLife()
    life.forward()
    assert life.in_forward and life.gradient() and not life.in_forward
    assert life.open
    with pytest.raises(RuntimeError, match="close the open round"):
        life.forward()  # the plane closes it first
    assert life.close() and not life.close()  # closing twice does nothing
    assert life.orphans_due() and not life.orphans_due()
    life.forward()
    assert life.phase is Phase.FORWARD and life.index == 1


def test_a_second_backward_without_a_forward_stays_in_the_same_round():
    life = RoundLife()
    life.forward()
    assert life.gradient() and not life.gradient()
    life.close()
    assert not life.gradient() and life.index == 1  # (the plane then refuses a gradient handed over twice)


def test_a_joined_rank_shadows_a_round_and_the_next_gradient_opens_another():
    trace: list[str] = []
    life = RoundLife(trace)
    life.shadowed()
    life.shadowed()
    assert life.index == 2 and life.phase is Phase.CLOSED
    life.forward()
    assert life.gradient() and life.index == 3
    with pytest.raises(RuntimeError, match="before shadowing"):
        life.shadowed()
    assert trace == ["shadowed: round 1 closed", "shadowed: round 2 closed", "forward: round 2 forward",
                     "gradient: round 3 open"]


def test_stepping_an_open_round_is_refused():
    life = RoundLife()
    life.forward()
    life.gradient()
    with pytest.raises(RuntimeError, match="before stepping"):
        life.stepped()
