"""Built-in model tables: exact parameter counts, FLOPs, tied weights, JSON profiles."""

from __future__ import annotations

import json

import pytest

from gradsched.models import MODELS, ModelTable, model_table
from gradsched.models.table import Layer, ParamSpec

# Published parameter counts of the reference definitions.
PARAMS = {
    "vgg16": 138_357_544,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "bert-large": 335_141_888,
    # encoder-decoder base: 6+6 layers, d 512, FFN 2048, one shared 37000 x 512 embedding
    "transformer": 37000 * 512 + 6 * 3_152_384 + 6 * 4_204_032,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_counts_are_exact(name):
    table = model_table(name, batch=2)
    assert table.num_params == PARAMS[name]
    assert table.gradient_bytes == 4 * PARAMS[name]
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in table.layers)
    names = [t.name for t in table.tensors()]
    assert len(names) == len(set(names))


def test_papers_ten_thousand_class_head():
    assert model_table("resnet50", batch=2, num_classes=10000).num_params == 25_557_032 + 2048 * 9000 + 9000
    assert model_table("vgg16", batch=2, num_classes=10000).num_params == 138_357_544 + 4096 * 9000 + 9000


def test_resnet50_flops_and_backward_ratio():
    table = model_table("resnet50", batch=1)
    # 4.09 GMACs per 224x224 image, counted as 2 FLOPs per multiply-add
    assert table.meta["forward_flops"] == pytest.approx(8.18e9, rel=0.01)
    # backward computes input and weight gradients (2x), except the first layer's input
    assert 1.95 < table.meta["backward_flops"] / table.meta["forward_flops"] < 2.0
    batch32 = model_table("resnet50", batch=32)
    assert 1.8 < (batch32.compute_s - batch32.forward_s) / batch32.forward_s < 2.05


def test_compute_time_scales_with_batch_and_device():
    small, large = model_table("resnet50", batch=8), model_table("resnet50", batch=64)
    assert 6 < large.compute_s / small.compute_s < 8.1
    assert model_table("resnet50", batch=8, device="h100").compute_s < small.compute_s / 3


def test_tied_embedding_belongs_to_its_first_user():
    table = model_table("transformer", batch=2, seq_len=16)
    assert table.layers[0].name == "embed"
    assert [p.name for p in table.layers[0].params] == ["embed.weight"]
    owners = [layer.name for layer in table.layers for p in layer.params if p.name.endswith("embed.weight")]
    assert owners == ["embed"]
    # the output projection reuses it: its time joins the layer before it
    assert table.layers[-1].name == "decoder.5.norm3" and table.layers[-1].forward_s > 3 * table.layers[-2].forward_s


def test_priorities_follow_forward_order():
    tensors = model_table("resnet50", batch=2).tensors()
    assert [t.priority for t in tensors] == list(range(len(tensors)))
    assert tensors[0].name == "conv1.weight" and tensors[-1].name == "fc.bias"
    assert [t.layer for t in tensors] == sorted(t.layer for t in tensors)


def test_json_round_trip(tmp_path):
    table = model_table("resnet50", batch=4)
    path = tmp_path / "r50.json"
    table.save(path)
    loaded = ModelTable.load(path)
    assert loaded == table
    assert loaded.meta["batch"] == 4


@pytest.mark.parametrize(
    "data,match",
    [
        ([], "top level must be a JSON object"),
        ({"layers": []}, "missing field 'model'"),
        ({"model": "m"}, "missing field 'layers'"),
        ({"model": "m", "layers": [{"name": "a", "forward_s": 1, "params": []}]}, r"layers\[0\] is missing field 'backward_s'"),
        ({"model": "m", "layers": [{"name": "a", "forward_s": "1", "backward_s": 1, "params": []}]}, r"layers\[0\].forward_s must be"),
        ({"model": "m", "layers": [{"name": "a", "forward_s": 1, "backward_s": 1, "params": [{"name": "w"}]}]}, r"params\[0\] is missing field 'numel'"),
        ({"model": "m", "layers": [{"name": "a", "forward_s": 1, "backward_s": 1, "params": []}]}, "no parameters"),
        ({"model": "m", "layers": [{"name": "a", "forward_s": -1, "backward_s": 1, "params": [{"name": "w", "numel": 3}]}]}, ">= 0"),
        ({"format": 9, "model": "m", "layers": []}, "format 9 is not supported"),
    ],
)
def test_malformed_profiles_name_the_field(tmp_path, data, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        ModelTable.load(path)


def test_unreadable_profiles(tmp_path):
    with pytest.raises(ValueError, match="cannot read profile"):
        ModelTable.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelTable.load(bad)


def test_shared_parameter_listed_twice_is_rejected():
    with pytest.raises(ValueError, match="appears twice"):
        ModelTable("m", (Layer("a", 0, 0, (ParamSpec("w", 1),)), Layer("b", 0, 0, (ParamSpec("w", 1),))))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(name="alexnet"), "unknown model 'alexnet'"),
        (dict(name="resnet50", batch=0), "batch must be"),
        (dict(name="resnet50", device="tpu"), "unknown device 'tpu'"),
        (dict(name="resnet50", num_classes=0), "classes must be"),
    ],
)
def test_bad_model_requests(kwargs, match):
    with pytest.raises(ValueError, match=match):
        model_table(**kwargs)
