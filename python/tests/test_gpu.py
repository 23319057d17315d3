"""CUDA backend through torch: equal to the CPU backend, the caller's stream, torch.cuda.graph capture + replay
with new inputs and routing, torch.compile (default and reduce-overhead), and the Python call overhead at T=1.
Skipped without a CUDA device and a CUDA build. Results go to tests/gpu-results/python.json."""
import json
import os
import statistics
import time

import numpy as np
import pytest

import npref
import nvfp4moe
from conftest import HAVE_CUDA, HAVE_TORCH

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs torch with CUDA and a CUDA build")]
if HAVE_TORCH:
    import torch

    import nvfp4moe.torch as nt

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = os.environ.get("NVFP4MOE_GPU_RESULTS", os.path.join(_ROOT, "tests", "gpu-results", "python.json"))
_results = {}


def _record(key, value):
    _results[key] = value
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, **_results}, f, indent=1)


# A larger shape than the CPU tests (tile-sized), written by the same Python checkpoint writer.
GH, GI, GE, GK = 512, 256, 16, 4


@pytest.fixture(scope="module")
def gck(tmp_path_factory):
    d = npref.write_qwen3_checkpoint(str(tmp_path_factory.mktemp("gpu")), hidden=GH, intermediate=GI,
                                     num_experts=GE, top_k=GK, num_layers=1, seed=3)
    c = nvfp4moe.Checkpoint(d)
    yield c
    c.close()


@pytest.fixture(scope="module", params=["w4a16", "w4a4"])
def layers(request, gck):
    mode = request.param
    return (nvfp4moe.MoeLayer(gck, 0, mode=mode, max_tokens=256, device="cuda"),
            nvfp4moe.MoeLayer(gck, 0, mode=mode, max_tokens=256, device="cpu"))


def _inputs(T, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, GH, generator=g).to(torch.bfloat16)
    logits = torch.randn(T, GE, generator=g)
    return x.cuda(), logits.cuda()


def _topk(logits):
    w, ids = torch.topk(torch.softmax(logits, -1), GK, dim=-1)
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


@pytest.mark.parametrize("T", [1, 7, 64, 256])
def test_cuda_equals_cpu_backend(layers, T):
    gpu, cpu = layers
    x, logits = _inputs(T, T)
    out = gpu.forward(x, router_logits=logits)
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == (T, GH)
    out32 = torch.empty(T, GH, device="cuda")
    gpu.forward(x, router_logits=logits, out=out32)
    ref = cpu.forward(x.cpu(), router_logits=logits.cpu(), out=torch.empty(T, GH))
    err = npref.rel_l2(out32.cpu().numpy(), ref.numpy())
    _record(f"rel_l2_cuda_vs_cpu_{gpu.mode}_T{T}", err)
    assert err <= 1e-3
    ids, w = _topk(logits)
    out2 = gpu.forward(x, topk_ids=ids, topk_weights=w, out=torch.empty(T, GH, device="cuda"))
    assert npref.rel_l2(out2.cpu().numpy(), ref.numpy()) <= 2e-3  # routing computed by torch, not by us


def test_runs_on_callers_stream(layers):
    gpu, _ = layers
    x, logits = _inputs(32, 5)
    want = gpu.forward(x, router_logits=logits)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    xs = torch.zeros_like(x)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps s busy: a layer on another stream would read xs too early
        xs.copy_(x)
        got = gpu.forward(xs, router_logits=logits)
    s.synchronize()
    assert torch.equal(got, want)


def test_cuda_graph_capture_replay_new_inputs_and_routing(layers):
    gpu, _ = layers
    T = 16
    sx, slog = _inputs(T, 10)
    sids, sw = _topk(slog)
    out_l = torch.empty(T, GH, dtype=torch.bfloat16, device="cuda")
    out_k = torch.empty(T, GH, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture, as torch recommends
        gpu.forward(sx, router_logits=slog, out=out_l)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gpu.forward(sx, router_logits=slog, out=out_l)
        gpu.forward(sx, topk_ids=sids, topk_weights=sw, out=out_k)
    for seed in (11, 12, 13):
        x, logits = _inputs(T, seed)
        ids, w = _topk(logits)
        sx.copy_(x), slog.copy_(logits), sids.copy_(ids), sw.copy_(w)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_l, gpu.forward(x, router_logits=logits))
        assert torch.equal(out_k, gpu.forward(x, topk_ids=ids, topk_weights=w))
    _record(f"cuda_graph_replay_equal_eager_{gpu.mode}", True)


def test_custom_op_under_cuda_graph(layers):
    gpu, _ = layers
    m = nt.NvFp4MoE(gpu)
    sx, slog = _inputs(8, 20)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(sx, slog)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sout = m(sx, slog)
    x, logits = _inputs(8, 21)
    sx.copy_(x), slog.copy_(logits)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(sout, m(x, logits))


class Block(torch.nn.Module if HAVE_TORCH else object):
    def __init__(self, layer):
        super().__init__()
        self.moe = nt.NvFp4MoE(layer)

    @staticmethod
    def norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def forward(self, x, logits):
        return x + self.moe(self.norm(x), logits)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_equals_eager(layers, mode):
    """The op under torch.compile gives the eager op's bits; a block around it (an RMS norm before, a residual
    add after) is compared against eager with inductor rounding its bf16 intermediates as eager does
    (emulate_precision_casts). Without that, inductor keeps the norm in fp32 and the MoE sees other inputs
    (seen on the H200: 8.8% of the outputs off by up to 3 bf16 ulps), which says nothing about the op."""
    import torch._inductor.config as inductor_config

    gpu, _ = layers
    block = Block(gpu)
    compiled_moe = torch.compile(block.moe, mode=mode, fullgraph=True)
    worst = 0.0
    exact = True
    with inductor_config.patch(emulate_precision_casts=True):
        compiled = torch.compile(block, mode=mode, fullgraph=True)
        for T in (4, 4, 4, 32, 32, 32):  # repeated calls: reduce-overhead records and replays CUDA graphs
            x, logits = _inputs(T, T + 100)
            h = block.norm(x)
            assert torch.equal(compiled_moe(h, logits).clone(), block.moe(h, logits)), f"op alone, T={T}"
            eager = block(x, logits)
            got = compiled(x, logits).clone()
            err = npref.rel_l2(got.float().cpu().numpy(), eager.float().cpu().numpy())
            worst = max(worst, err)
            exact = exact and torch.equal(got, eager)
            # bf16 output rounding is 2^-9 relative; a wrong op (stale buffer, other stream) is O(1)
            assert err <= 5e-3, f"block, T={T}: rel_l2 {err:.3e}"
    _record(f"torch_compile_{mode}_op_bitwise_equal_eager_{gpu.mode}", True)
    _record(f"torch_compile_{mode}_block_rel_l2_vs_eager_{gpu.mode}", worst)
    _record(f"torch_compile_{mode}_block_bitwise_equal_eager_{gpu.mode}", exact)


def test_fused_experts_cuda(layers):
    gpu, _ = layers
    x, logits = _inputs(9, 30)
    w, ids = torch.topk(torch.softmax(logits, -1), GK, dim=-1)
    got = nt.fused_experts(x, gpu, w, ids)
    assert torch.equal(got, gpu.forward(x, topk_ids=ids.to(torch.int32), topk_weights=w.float()))


def _per_call_us(fn, iters=100, rounds=30):
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def test_python_call_overhead_T1(gck):
    gpu = nvfp4moe.MoeLayer(gck, 0, mode="w4a16", max_tokens=256, device="cuda")
    x, logits = _inputs(1, 40)
    ids, w = _topk(logits)
    out = torch.empty(1, GH, dtype=torch.bfloat16, device="cuda")
    iters, rounds = 100, 30
    cpp = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        cpp.append(gpu._bench_forward(x, None, ids, w, out, None, iters) / iters * 1e6)
    cpp_us = statistics.median(cpp)
    py_out = _per_call_us(lambda: gpu.forward(x, None, ids, w, out), iters, rounds)
    py_kw = _per_call_us(lambda: gpu.forward(x, topk_ids=ids, topk_weights=w, out=out), iters, rounds)
    py_alloc = _per_call_us(lambda: gpu.forward(x, topk_ids=ids, topk_weights=w), iters, rounds)
    m = nt.NvFp4MoE(gpu)
    op = _per_call_us(lambda: m(x, None, ids, w), iters, rounds)
    res = {"cpp_forward_us": cpp_us, "python_forward_us": py_out, "python_forward_kwargs_us": py_kw,
           "python_forward_alloc_out_us": py_alloc, "torch_custom_op_us": op,
           "python_overhead_us": py_out - cpp_us, "target_overhead_us": 5.0}
    print("\nT=1 host time per call (us):", json.dumps(res, indent=1))
    _record("overhead_T1", res)
    torch.cuda.synchronize()
    assert py_out - cpp_us < 50  # a loose sanity bound; the 5 us target is reported, not asserted
