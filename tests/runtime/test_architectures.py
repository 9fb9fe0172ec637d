"""Each architecture as an object (gradsched.runtime.architectures): what it refuses, each with
its reason, before any collective; what it models and hands off to. The behaviour of each in
training is the contract suite's (tests/distributed/test_architecture_contract.py)."""

from __future__ import annotations

import pytest
import torch

from gradsched.runtime import GradschedError, RuntimeConfig
from gradsched.runtime.architectures.choice import choose


def arch(name: str, **options):
    return choose(RuntimeConfig.from_options({"architecture": name, "servers": 1 if name == "ps" else 0, **options}))


CPU = [torch.zeros(4, 4)]
ELSEWHERE = [torch.zeros(4, 4, device="meta")]  # not on the CPU, as a CUDA tensor is not


@pytest.mark.parametrize("name, params, backend, options, refused", [
    ("allreduce", ELSEWHERE, "nccl", {"find_unused_parameters": True}, []),
    ("ps", CPU, "gloo", {}, []),
    ("ps", ELSEWHERE, "gloo", {}, ["moves CPU tensors over gloo for now"]),
    ("ps", CPU, "nccl", {}, ["needs the gloo backend: NCCL matches point-to-point operations by their order"]),
    ("sharded", CPU, "gloo", {}, []),
    ("sharded", ELSEWHERE, "gloo", {}, ["does not support parameters on meta"]),
    ("sharded", [torch.zeros(4, 4).t()], "gloo", {}, ["does not support non-contiguous parameters"]),
    ("sharded", CPU, "gloo", {"find_unused_parameters": True}, []),
    ("fully_sharded", CPU, "gloo", {"find_unused_parameters": True},
     ["does not support find_unused_parameters=True (its parameters are gathered as each module runs"]),
])
def test_what_each_architecture_refuses_says_why(name, params, backend, options, refused):
    config = RuntimeConfig.from_options({"architecture": name, "servers": 1 if name == "ps" else 0, **options})
    said = choose(config).refusals(params, config, backend)
    assert len(said) == len(refused) and all(reason in text for reason, text in zip(refused, said)), said


def test_hooks_join_and_optimizers_each_refused_where_they_cannot_run():
    assert arch("allreduce").comm_hook_refusal is None and arch("allreduce").join_refusal is None
    assert arch("ps").comm_hook_refusal == "the servers reduce" and arch("ps").join_refusal is None
    assert arch("sharded").comm_hook_refusal == "messages are reduce-scattered"
    assert "update its shards and serve the all-gathers" in arch("sharded").join_refusal
    p = torch.nn.Parameter(torch.zeros(2))
    arch("sharded").check_optimizer(torch.optim.AdamW([p]))
    with pytest.raises(GradschedError, match="LBFGS needs every gradient at once"):
        arch("sharded").check_optimizer(torch.optim.LBFGS([p]))
    arch("allreduce").check_optimizer(torch.optim.LBFGS([p]))  # the frontend refuses it for its own reason


def test_only_all_reduce_hands_kept_buckets_to_ddps_reducer():
    config = RuntimeConfig()
    reducer = arch("allreduce").handed_off(config, workers=2)
    assert reducer is not None and reducer.name == "ddp-reducer" and reducer.handed_off(config, 2) is None
    assert arch("allreduce").handed_off(config, workers=1) is None  # nothing to reduce with one worker
    assert arch("allreduce").handed_off(RuntimeConfig(handoff=False), workers=2) is None
    assert arch("ps").handed_off(RuntimeConfig(architecture="ps", servers=1), 2) is None
    assert arch("sharded").handed_off(RuntimeConfig(architecture="sharded"), 2) is None


def test_how_plans_model_each_link():
    models = [arch(name).link_model() for name in ("allreduce", "ps", "sharded")]
    assert [m.sim for m in models] == ["allreduce", "ps", "allreduce"]
    assert models[0].link(1e-3, 1e-9, 2e-4) == (1e-3, 1e-9, 2e-4)
    latency, per_byte, per_message = models[1].link(1e-3, 1e-9, 2e-4)  # one direction of a push and pull
    assert (latency, per_byte, per_message) == pytest.approx((3e-4, 1e-9, 2e-4))
    assert [m.probed for m in models] == [True, False, False]
    assert arch("ps").servers == 1 and arch("allreduce").servers == 0
