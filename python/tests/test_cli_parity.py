"""The Python binding and the C++ CLI (`nvfp4moe run --input/--output`) give the same bits on the CPU backend.

The CLI is found through NVFP4MOE_CLI (as the C++ tests do) or at build/nvfp4moe; skipped when neither exists.
"""
import os
import subprocess

import numpy as np
import pytest

import npref
import nvfp4moe
from conftest import E, H, K

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("NVFP4MOE_CLI") or os.path.join(_ROOT, "build", "nvfp4moe")
pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"CLI not built ({CLI}); set NVFP4MOE_CLI")


def _run_cli(ckpt_dir, tmp_path, mode, tensors):
    inp, outp = tmp_path / f"in_{mode}.safetensors", tmp_path / f"out_{mode}.safetensors"
    npref.write_safetensors(str(inp), tensors)
    subprocess.run([CLI, "run", ckpt_dir, "--layer", "0", "--mode", mode, "--backend", "cpu", "--input", str(inp),
                    "--output", str(outp), "--no-reference"], check=True, capture_output=True, timeout=300)
    return npref.read_safetensors(str(outp))["out"]


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
def test_logits_bitwise_equal_to_cli(ckpt, ckpt_dir, tmp_path, mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((11, H)).astype(np.float32)
    logits = rng.standard_normal((11, E)).astype(np.float32)
    want = _run_cli(ckpt_dir, tmp_path, mode, {"hidden": ("F32", x), "router_logits": ("F32", logits)})
    layer = nvfp4moe.MoeLayer(ckpt, 0, mode=mode, max_tokens=16, device="cpu")
    assert np.array_equal(layer.forward(x, router_logits=logits), want)


def test_topk_bitwise_equal_to_cli(ckpt, ckpt_dir, tmp_path):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(6)]).astype(np.int32)
    w = rng.uniform(0.1, 1, size=(6, K)).astype(np.float32)
    want = _run_cli(ckpt_dir, tmp_path, "w4a16",
                    {"hidden": ("F32", x), "topk_ids": ("I32", ids), "topk_weights": ("F32", w)})
    layer = nvfp4moe.MoeLayer(ckpt, 0, mode="w4a16", max_tokens=6, device="cpu")
    assert np.array_equal(layer.forward(x, topk_ids=ids, topk_weights=w), want)
