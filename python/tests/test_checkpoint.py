"""nvfp4moe.Checkpoint: discovery, spec, inspect, close, and file errors surfacing as ValueError."""
import dataclasses
import json
import os
import shutil

import pytest

import nvfp4moe
from conftest import E, H, I, K


def test_layers_and_spec(ckpt, ckpt_dir):
    assert ckpt.path == ckpt_dir
    assert ckpt.moe_layers == [0, 1]
    assert ckpt.format == "modelopt"
    s = ckpt.spec(0)
    assert isinstance(s, nvfp4moe.MoeSpec) and dataclasses.is_dataclass(s)
    assert (s.layer, s.hidden, s.intermediate, s.num_experts, s.top_k) == (0, H, I, E, K)
    assert s.activation == "swiglu" and s.routing == "softmax_topk" and s.norm_topk_prob
    assert s.shared_intermediate == 0
    assert dataclasses.asdict(s)["hidden"] == H
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.hidden = 1
    assert ckpt.spec(1).layer == 1
    layers = ckpt.layers
    assert [d["layer"] for d in layers] == [0, 1] and all(d["is_moe"] for d in layers)


def test_inspect_and_repr(ckpt):
    text = ckpt.inspect()
    assert isinstance(text, str) and text
    assert "moe_layers=[0, 1]" in repr(ckpt)


def test_spec_of_missing_layer_is_value_error(ckpt):
    with pytest.raises(ValueError):
        ckpt.spec(99)


def test_closed_checkpoint_raises(ckpt_dir):
    c = nvfp4moe.Checkpoint(ckpt_dir)
    layer = nvfp4moe.MoeLayer(c, 0, device="cpu", max_tokens=4)
    c.close()
    assert c.closed and "closed" in repr(c)
    for use in (lambda: c.moe_layers, lambda: c.spec(0), lambda: c.inspect(), lambda: c.layers,
                lambda: nvfp4moe.MoeLayer(c, 0, device="cpu")):
        with pytest.raises(ValueError, match="closed"):
            use()
    c.close()  # idempotent
    assert layer.spec.hidden == H  # a layer keeps its own weights


def test_context_manager(ckpt_dir):
    with nvfp4moe.Checkpoint(ckpt_dir) as c:
        assert c.moe_layers == [0, 1]
    assert c.closed


def test_layer_from_path(ckpt_dir):
    layer = nvfp4moe.MoeLayer(ckpt_dir, 1, device="cpu", max_tokens=2)
    assert layer.spec.layer == 1 and layer.device == "cpu" and layer.max_tokens == 2
    assert layer.weight_bytes > 0
    assert "E=8" in repr(layer)


def test_missing_directory_is_value_error(tmp_path):
    with pytest.raises(ValueError):
        nvfp4moe.Checkpoint(str(tmp_path / "does-not-exist"))


def test_malformed_config_is_format_error(ckpt_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt_dir, bad)
    (bad / "config.json").write_text("{ not json")
    with pytest.raises(nvfp4moe.FormatError) as ei:
        nvfp4moe.Checkpoint(str(bad))
    assert isinstance(ei.value, ValueError)


def test_unsupported_group_size_is_format_error(ckpt_dir, tmp_path):
    bad = tmp_path / "gs32"
    shutil.copytree(ckpt_dir, bad)
    q = json.loads((bad / "hf_quant_config.json").read_text())
    q["quantization"]["group_size"] = 32
    (bad / "hf_quant_config.json").write_text(json.dumps(q))
    with pytest.raises(nvfp4moe.FormatError, match="32"):
        nvfp4moe.Checkpoint(str(bad))


def test_truncated_shard_is_format_error(ckpt_dir, tmp_path):
    bad = tmp_path / "trunc"
    shutil.copytree(ckpt_dir, bad)
    p = bad / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError):
        c = nvfp4moe.Checkpoint(str(bad))  # the reader may check offsets at open ...
        nvfp4moe.MoeLayer(c, 0, device="cpu")  # ... or when the layer is loaded


@pytest.mark.skipif(not getattr(nvfp4moe._core, "have_generator", False), reason="no synthetic generator in build")
def test_generate_checkpoint(tmp_path):
    path = nvfp4moe.generate_checkpoint(str(tmp_path / "gen"))
    c = nvfp4moe.Checkpoint(path)
    assert c.moe_layers
    assert c.spec(c.moe_layers[0]).num_experts > 0
