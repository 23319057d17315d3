"""torch integration on the CPU backend: torch in -> torch out, the custom op (schema + fake), the nn.Module,
torch.compile, and fused_experts. Skipped where torch is not installed (CI's CPU machine: the PyPI torch wheel
pulls ~3 GB of CUDA libraries); the same checks run on CUDA tensors in test_gpu.py."""
import gc

import numpy as np
import pytest

import npref
import nvfp4moe
from conftest import E, H, HAVE_TORCH, K

pytestmark = [pytest.mark.torch, pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")]
if HAVE_TORCH:
    import torch

    import nvfp4moe.torch as nt


def _inputs(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    logits = torch.randn(T, E, generator=g)
    return x, logits


def test_torch_in_torch_out(cpu_layer):
    x, logits = _inputs(7)
    out = cpu_layer.forward(x, router_logits=logits)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (7, H)
    ref = cpu_layer.forward(x.float().numpy(), router_logits=logits.numpy())
    assert torch.equal(out.float(), torch.from_numpy(npref.bf16_round(ref)))
    out32 = torch.empty(7, H)
    assert cpu_layer.forward(x, router_logits=logits, out=out32) is out32
    assert np.array_equal(out32.numpy(), ref)


def test_torch_dtype_and_device_errors(cpu_layer):
    x, logits = _inputs(2)
    with pytest.raises(TypeError, match="hidden"):
        cpu_layer.forward(x.double(), router_logits=logits)
    with pytest.raises(TypeError, match="topk_ids"):
        cpu_layer.forward(x, topk_ids=torch.zeros(2, K, dtype=torch.int64), topk_weights=torch.ones(2, K))
    with pytest.raises(ValueError, match="hidden"):
        cpu_layer.forward(torch.empty(2, H, dtype=torch.bfloat16, device="meta"), router_logits=logits)


def test_custom_op_matches_forward(cpu_layer):
    x, logits = _inputs(5)
    h = nt.register_layer(cpu_layer)
    try:
        got = torch.ops.nvfp4moe.moe_forward(x, h, logits, None, None)
        assert torch.equal(got, cpu_layer.forward(x, router_logits=logits))
    finally:
        nt.unregister_layer(h)
    with pytest.raises(ValueError, match="handle"):
        torch.ops.nvfp4moe.moe_forward(x, h, logits, None, None)


def test_opcheck(cpu_layer):
    x, logits = _inputs(3)
    h = nt.register_layer(cpu_layer)
    try:
        ids = torch.tensor([[0, 1], [2, 3], [4, -1]], dtype=torch.int32)
        w = torch.rand(3, K)
        for args in ((x, h, logits, None, None), (x, h, None, ids, w)):
            torch.library.opcheck(nt.moe_forward, args, test_utils=("test_schema", "test_faketensor"))
    finally:
        nt.unregister_layer(h)


def test_module_and_registry(cpu_layer, ckpt):
    m = nt.NvFp4MoE(cpu_layer)
    x, logits = _inputs(4)
    assert torch.equal(m(x, logits), cpu_layer.forward(x, router_logits=logits))
    h = m.handle
    assert nt.get_layer(h) is cpu_layer
    del m
    gc.collect()
    with pytest.raises(ValueError):
        nt.get_layer(h)
    m2 = nt.NvFp4MoE(ckpt, 1, max_tokens=4, device="cpu")
    assert m2.spec.layer == 1 and "layer=1" in repr(m2)


class Block(torch.nn.Module if HAVE_TORCH else object):
    def __init__(self, layer):
        super().__init__()
        self.moe = nt.NvFp4MoE(layer)

    def forward(self, x, logits):
        h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
        return x + self.moe(h, logits)


def test_torch_compile_equals_eager(cpu_layer):
    block = Block(cpu_layer)
    compiled = torch.compile(block, fullgraph=True)
    for T in (3, 8):
        x, logits = _inputs(T, seed=T)
        eager = block(x, logits)
        got = compiled(x, logits)
        torch.testing.assert_close(got, eager, rtol=1.6e-2, atol=1e-2)
        assert torch.equal(compiled.moe(x, logits), block.moe(x, logits))


def test_fused_experts(cpu_layer):
    x, logits = _inputs(6)
    w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)  # int64 ids, like torch.topk gives
    w = w / w.sum(-1, keepdim=True)
    got = nt.fused_experts(x, cpu_layer, w.to(torch.bfloat16), ids)
    want = cpu_layer.forward(x, topk_ids=ids.to(torch.int32), topk_weights=w.to(torch.bfloat16).float())
    assert torch.equal(got, want)
    m = nt.NvFp4MoE(cpu_layer)

    class FakeVllmLayer:  # what a vLLM quant method would hold: the FusedMoE layer with our module attached
        nvfp4moe = m

    x2 = x.clone()
    assert nt.fused_experts(x2, FakeVllmLayer(), w, ids, inplace=True) is x2
    assert torch.equal(x2, nt.fused_experts(x, m, w, ids))
    with pytest.raises(ValueError, match="activation"):
        nt.fused_experts(x, m, w, ids, activation="gelu")
    with pytest.raises(NotImplementedError):
        nt.fused_experts(x, m, w, ids, expert_map=torch.arange(E))
    with pytest.raises(TypeError):
        nt.fused_experts(x, object(), w, ids)
    # int64 ids past int32 must not wrap into range (2**32 + 1 is not expert 1): the cpu layer refuses them
    for bad in (2**32 + 1, -(2**32) + 1):
        wrapped = ids.clone()
        wrapped[0, 0] = bad
        with pytest.raises(ValueError, match="topk_ids"):
            nt.fused_experts(x, cpu_layer, w, wrapped)
