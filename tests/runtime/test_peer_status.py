"""What a failing rank says about the others (gradsched.runtime.diagnostics.peer_status.describe): the
diagnosis of uneven inputs only where a rank is behind and has stopped."""

from gradsched.runtime.diagnostics.peer_status import Status, describe

UNEVEN = "stopped after fewer backward passes than this rank"


def test_a_rank_that_closed_earlier_is_named_with_uneven_inputs():
    text = describe(2, Status(10, "training", 0.0), {0: Status(9, "closed", 4.0), 1: Status(10, "training", 0.2)})
    assert "this rank (2) is in backward pass 10" in text
    assert "rank 0 closed gradsched after 9 backward passes" in text
    assert "rank 1 is at backward pass 10, its latest forward pass began 0 s ago" in text
    assert f"Rank 0 {UNEVEN}" in text and "rank 1 stopped" not in text


def test_a_rank_idle_behind_is_named_but_one_just_computing_is_not():
    idle = describe(0, Status(7, "training", 0.0), {1: Status(6, "training", 30.0)})
    busy = describe(0, Status(7, "training", 0.0), {1: Status(6, "training", 0.5)})
    assert f"Rank 1 {UNEVEN}" in idle and "stuck outside gradsched" in idle
    assert UNEVEN not in busy


def test_silent_and_joined_ranks_are_reported_without_a_diagnosis():
    text = describe(0, Status(5, "training", 0.0), {1: None, 2: Status(5, "joined", 1.0)})
    assert "rank 1 did not answer (its process ended, was killed or is stopped)" in text
    assert "rank 2 has joined" in text
    assert UNEVEN not in text


def test_several_ranks_behind_are_all_named():
    text = describe(3, Status(4, "training", 0.0), {0: Status(3, "closed", 1.0), 1: Status(2, "closed", 1.0),
                                                    2: Status(4, "training", 0.0)})
    assert f"Rank 0 and rank 1 {UNEVEN}" in text


def test_a_ranks_report_is_read_from_its_rounds():
    """The watcher reads the run's rounds (no reference back to the coordinator): the backward
    pass it heads to, joined or closed."""
    from gradsched.runtime.diagnostics.peer_status import status_of
    from gradsched.runtime.training.lifecycle import RoundLife

    life = RoundLife()
    life.forward()
    life.gradient()
    life.close()
    life.forward()  # a forward pass began: heading to round 2
    assert (status_of(life).round, status_of(life).state) == (2, "training")
    life.joined = True
    assert (status_of(life).round, status_of(life).state) == (1, "joined")
    life.closed = True
    assert status_of(life).state == "closed"
