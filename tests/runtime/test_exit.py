"""At exit gradsched destroys the process groups it created (while the interpreter is whole),
and leaves the user's default group alone (one gloo rank)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
from torch import nn

import gradsched
from gradsched.runtime.comm import topology


def test_the_groups_gradsched_made_are_destroyed_and_the_default_one_kept(world_of_one):
    model = nn.Linear(4, 2)
    earlier = len(topology._CREATED)  # groups of earlier tests' wraps, gone with their default groups
    model, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "prophet")
    made = topology._CREATED[earlier:]
    assert len(made) == 4 and all(g in dist.distributed_c10d._world.pg_map for g in made)  # control, data, buffers, broadcasts
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.close()
    topology.destroy_created()
    assert not any(g in dist.distributed_c10d._world.pg_map for g in made) and topology._CREATED == []
    assert dist.is_initialized()
    dist.all_reduce(torch.ones(1))  # the user's group still works
    topology.destroy_created()  # twice is harmless


def test_a_script_that_never_destroys_its_group_exits_cleanly(tmp_path):
    """No ``optimizer.close()``, no ``destroy_process_group()``: the exit handler closes and
    destroys what gradsched made; the process ends with status 0 and nothing on stderr but
    PyTorch's own reminder."""
    script = textwrap.dedent("""
        import sys, torch, torch.distributed as dist, gradsched
        dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
        model = torch.nn.Linear(4, 2)
        model, optimizer = gradsched.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "bytescheduler")
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
        print("trained")
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"store{i}")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(3)]  # three at once: one start-up
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0 and out.strip() == "trained", err[-2000:]
        assert "terminate called" not in err


def test_a_wrap_that_fails_half_way_leaves_no_hooks_or_threads(world_of_one, monkeypatch):
    """A coordinator whose construction fails after its launcher started (here: making the
    planner fails) removes the hooks it attached and stops its threads: otherwise the next
    wrap of the same model would train with two coordinators, and the first one's
    collectives would still be running at exit."""
    import threading

    from gradsched.runtime.training import plane

    def broken(*args, **kwargs):
        raise RuntimeError("no planner today")

    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {t.name for t in threading.enumerate()}
    monkeypatch.setattr(plane, "Planner", broken)
    try:
        gradsched.wrap(model, optimizer, "prophet")
    except RuntimeError as exc:
        assert "no planner today" in str(exc)
    else:
        raise AssertionError("wrap did not fail")
    monkeypatch.undo()
    assert not model.weight._post_accumulate_grad_hooks and not model.bias._post_accumulate_grad_hooks
    assert not model._forward_pre_hooks
    assert {t.name for t in threading.enumerate()} - before == set()
    model, optimizer = gradsched.wrap(model, optimizer, "prophet")  # and it can be wrapped again
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.close()
