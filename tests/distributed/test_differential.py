"""gradsched against torch's DDP over generated training programs (tests/distributed/programs.py).

* The default set runs a fixed-seed sample of programs on two ranks (every API, policy and
  architecture but parameter servers), and a smaller one with a parameter server (three ranks);
  the slow set runs many more of each. docs/testing.md, "Differential testing", lists what a
  program draws and the budgets.
* Every counterexample the programs found is kept below as an explicit program
  (:data:`FOUND`), with what it showed before its fix; and the idioms of issue 54's table, every
  policy, on gloo and under NCCL's semantics emulated.
* Planted defects (tests/mutant) make the generated programs fail: a gradsched that never
  reduces, and one whose deferred update reads ``.grad`` when it is applied.

``GRADSCHED_PROGRAMS=N`` sets the default set's number of programs, ``GRADSCHED_PROGRAMS_RANDOM=1``
draws them afresh (not from the fixed seed), ``GRADSCHED_PROGRAMS_SHRINK=0`` reports a failure
without shrinking it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from programs import STATS, Program, ServerProgram, stop_all
from test_mutant import MUTANT


def budget(examples: int, steps: int, shrink: bool = True) -> settings:
    shrink = shrink and os.environ.get("GRADSCHED_PROGRAMS_SHRINK", "1") == "1"
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    derandomize=os.environ.get("GRADSCHED_PROGRAMS_RANDOM") != "1", database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck),
                    phases=[p for p in Phase if p is not Phase.shrink or shrink])


DEFAULT = int(os.environ.get("GRADSCHED_PROGRAMS", "20"))


@pytest.fixture(scope="module", autouse=True)
def _ranks():
    yield
    stop_all()


def run(machine: type[Program], budget: settings) -> None:
    STATS.clear()
    run_state_machine_as_test(machine, settings=budget)
    print(machine.__name__, dict(STATS))
    assert STATS["compared"] >= STATS["programs"] // 2, dict(STATS)  # most programs ran to their end


@pytest.mark.torch_range
def test_generated_programs_train_as_ddp_does():
    run(Program, budget(DEFAULT, 30))


def test_generated_programs_with_a_parameter_server_train_as_ddp_does():
    run(ServerProgram, budget(max(3, DEFAULT // 5), 30))


@pytest.mark.slow
def test_many_generated_programs_train_as_ddp_does():
    run(Program, budget(600, 50))


@pytest.mark.slow
def test_many_generated_programs_with_a_parameter_server_train_as_ddp_does():
    run(ServerProgram, budget(150, 50))


# -- what the programs found ----------------------------------------------------------------------
def config(**changes) -> dict:
    """A program's configuration: all-reduce through gradsched.wrap, SGD with momentum, no hand-off."""
    return {"api": "wrap", "policy": "prophet", "architecture": "allreduce", "optimizer": "sgd", "scheduler": False,
            "find_unused": False, "float64": False, "comm": "none", "handoff": False, "emulated": False, "seed": 0,
            **changes}


def train(seed: int = 0, sync: str = "yes", losses: str = "one", use_side: tuple = (True, True)) -> tuple:
    return "train", {"seed": seed, "use_side": list(use_side), "sync": sync, "losses": losses}


STEP = ("step", {"closure_seed": None, "use_side": [True, True]})


def zero(how: str) -> tuple:
    return "zero", {"how": how}


READ = ("read_grads", {})

#: Every counterexample the generated programs found, shrunk: (configuration, calls) and what it
#: showed before its fix (the note of issue 54 has each fix).
FOUND = {
    "step() before any backward pass": (
        config(architecture="fully_sharded"), [STEP]),  # ValueError: max() arg is an empty sequence (plans.py)
    "the wrapper's clipping before any backward pass": (
        config(api="ddp", policy="fifo"), [("clip", {"how": "wrapper_norm", "value": 0.01})]),  # GradschedError
    "a second backward pass over a forward pass that synced (retain_graph)": (
        config(policy="priority", emulated=True), [train(losses="retain"), READ]),  # "received a gradient twice"
    "no_sync() around the forward pass only": (
        config(policy="priority", emulated=True, find_unused=True),
        [train(sync="no_sync_forward", losses="retain", use_side=(False, False)), READ]),  # synced: DDP did not
    "a forward pass with gradients and no backward pass, then one inside no_sync()": (
        config(policy="fifo", comm="bf16", float64=True, optimizer="nesterov"),
        [("evaluate", {"seed": 29, "grad": True}), train(40, sync="no_sync_forward", losses="retain"), READ]),
    #   (DDP's reducer still expects the first one's backward pass: the second communicates; it stayed local)
    "model.zero_grad() after step(), then torch's clip_grad_norm_": (
        config(api="ddp", policy="priority", optimizer="adamw-groups", handoff=True),
        [train(28), STEP, zero("module"), train(8), STEP, zero("model"), ("clip", {"how": "norm", "value": 1.0})]),
    #   (a norm of 0.42 over gradients DDP had set to None)
    "model.zero_grad() after step(), then step() again": (
        config(policy="priority", find_unused=True, handoff=True), [train(26), STEP, zero("model"), STEP]),
    #   (the second step applied the first one's gradient again)
    "sharded: the wrapper's clipping of gradients accumulated under no_sync()": (
        config(api="ddp", architecture="sharded", optimizer="adagrad", scheduler=True, handoff=True, emulated=True),
        [zero("none"), train(42, sync="no_sync", losses="sum"), ("clip", {"how": "wrapper_norm", "value": 0.01})]),
    #   (the norm of the shards' first elements: a shard-sized cut of whole local gradients)
    "sharded: the wrapper's clipping with float64 and float32 gradients": (
        config(architecture="sharded", policy="priority", optimizer="rmsprop", float64=True, emulated=True, seed=1),
        [STEP, ("step", {"closure_seed": 39, "use_side": [True, True]}), ("clip", {"how": "wrapper_norm",
                                                                                   "value": 1.0})]),
    #   (a float32 norm where torch's, over both dtypes, is float64)
    "gradients set by hand, stepped behind a queued step, then p.grad.zero_()": (
        config(policy="bytescheduler", scheduler=True),
        [("step", {"closure_seed": 35, "use_side": [False, True]}), ("set_grads", {"seed": 0}),
         ("step", {"closure_seed": None, "use_side": [False, False]}), zero("zero_"), ("checkpoint", {})]),
    #   (the queued step read the user's gradient when applied: zeros by then; found with parameter servers)
    "sharded: step() on the same gradients set by hand on every rank, before any backward pass": (
        config(architecture="sharded", policy="bytescheduler", optimizer="adamw-groups"),
        [("set_grads", {"seed": 1, "same": True}), STEP, zero("optimizer"), train(2), STEP, READ, ("checkpoint", {})]),
    #   (GradschedError: step() on gradients this rank holds alone; torch.distributed.checkpoint's
    #   get_state_dict makes a fresh optimizer's state this way, with zeros)
    "fully sharded: step() on the same gradients set by hand after steps that synced": (
        config(architecture="fully_sharded", policy="prophet", optimizer="adamw-groups", emulated=True),
        [train(3), STEP, zero("optimizer"), ("set_grads", {"seed": 2, "same": True}), STEP, train(4), STEP,
         ("checkpoint", {})]),
}

#: ... and with a parameter server (ServerProgram)
FOUND_WITH_SERVERS = {
    "parameter servers: bf16 compression and a float64 layer among float32 ones": (
        config(policy="fifo", architecture="ps", float64=True, comm="bf16", handoff=True),
        [("iterations", {"seeds": [0], "zero": "optimizer"})]),
    #   (GradschedError: the servers expected one bf16 buffer, the launcher pushed one per dtype)
}


#: What the programs found that sharding cannot do as DDP does: each now refused, by name (REFUSALS).
FOUND_REFUSED = {
    "sharded: step() on gradients set by hand": (
        config(architecture="sharded", policy="fifo"), [train(3), ("set_grads", {"seed": 5}), STEP],
        "sharded: step() on gradients not averaged"),  # (each rank stepped its shard of its own gradients)
    "sharded: a backward pass under no_sync() onto averaged gradients": (
        config(architecture="sharded", policy="priority"), [train(3), train(4, sync="no_sync"), STEP],
        "sharded: a backward pass under no_sync() onto averaged gradients"),  # (the local gradient added
    #   to a shard-sized cut of the averaged one)
}


def run_program(configuration: dict, calls: list[tuple], machine: type[Program] = Program,
                refused: str | None = None) -> None:
    state = machine()
    state.start(configuration)
    for name, kwargs in calls:
        if state.running:
            getattr(state, name)(**kwargs)
    state.teardown()
    if refused is None:
        assert state.running, f"refused: {state.refusal}"
    else:
        assert not state.running and state.refusal == refused, state.refusal


@pytest.mark.parametrize("name", FOUND)
def test_what_the_programs_found(name):
    run_program(*FOUND[name])


@pytest.mark.parametrize("name", FOUND_WITH_SERVERS)
def test_what_the_programs_found_with_a_parameter_server(name):
    run_program(*FOUND_WITH_SERVERS[name], machine=ServerProgram)


@pytest.mark.parametrize("name", FOUND_REFUSED)
def test_what_sharding_cannot_do_as_ddp_is_refused_by_name(name):
    configuration, calls, refusal = FOUND_REFUSED[name]
    run_program(configuration, calls, refused=refusal)


#: The idioms of issue 54's table (each after loss.backward(), SGD with momentum, 4 steps; before the
#: fix bytescheduler and prophet differed from DDP by 3e-3 to 4e-2 in every row, fifo by 0)
IDIOMS = {
    "opt.step(); model.zero_grad()": lambda k: [STEP, zero("model")],
    "opt.step(); p.grad = None for every parameter": lambda k: [STEP, zero("none")],
    "opt.zero_grad() before opt.step() on some steps": lambda k: [zero("optimizer"), STEP] if k % 2 else
    [STEP, zero("optimizer")],
    "opt.step(); opt.step()": lambda k: [STEP, STEP, zero("optimizer")],
}
POLICY_OPTIONS = ("fifo", "priority", "bytescheduler", "prophet")
CI_IDIOMS = ("opt.step(); model.zero_grad()", "opt.step(); opt.step()")  # the generated programs draw the others


@pytest.mark.parametrize("emulated", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["gloo", "emulated-nccl"])  # CI: emulated, where a step left queued shows at once
@pytest.mark.parametrize("idiom", [i if i in CI_IDIOMS else pytest.param(i, marks=pytest.mark.slow) for i in IDIOMS])
def test_the_issue_table_idioms_train_as_ddp_does(idiom, emulated):
    for policy in POLICY_OPTIONS:
        calls = [call for k in range(4) for call in [train(k), *IDIOMS[idiom](k)]]
        run_program(config(policy=policy, emulated=emulated), [*calls, READ])


@pytest.mark.parametrize("ranks", [[True, False], [False, True]], ids=["rank 0", "rank 1"])
def test_buffers_changed_on_one_rank_between_two_forward_passes(ranks):
    """The buffer broadcast is issued as a forward pass ends, ahead of its round; the next forward
    pass takes it only if rank 0 says its buffers are unchanged since (else it broadcasts them
    afresh): rank 0's reset reaches every rank, rank 1's is overwritten, as under DDP."""
    for policy in ("fifo", "prophet"):
        run_program(config(policy=policy, emulated=True),
                    [train(0), STEP, zero("optimizer"), ("reset_statistics", {"ranks": ranks}), train(1), STEP,
                     ("evaluate", {"seed": 2, "grad": False})])


# -- planted defects --------------------------------------------------------------------------------
@pytest.mark.parametrize("mutant", [pytest.param("no-reduction", marks=pytest.mark.slow),
                                    "grad-at-apply"])  # CI: the defect this file was built for (test_mutant.py: the other)
def test_the_generated_programs_fail_on_a_planted_defect(mutant):
    class Planted(Program):
        cluster_name = mutant
        cluster_env = {**MUTANT, "GRADSCHED_MUTANT": mutant}

    STATS.clear()
    with pytest.raises(Exception):  # noqa: B017 - what it raises is Hypothesis' report of the first difference
        run_state_machine_as_test(Planted, settings=budget(20, 30, shrink=False))
    assert STATS["differed"] >= 1, dict(STATS)  # (not a failure of another kind)
