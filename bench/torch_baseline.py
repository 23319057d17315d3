#!/usr/bin/env python3
"""Ceilings and the torch bf16 baseline of benchmarks.md, measured in the same run as our bench driver.

What a user would otherwise run on Hopper: the NVFP4 weights dequantized to bf16 and the layer built from
torch's grouped GEMM (torch._grouped_mm), the whole layer (routing .. combine) captured in one CUDA graph.
A replay runs L distinct layers (each its own weights and routing, as in a real model) so that nothing a
replay reads is still in L2 from the previous one; figures are time / L.

Usage: torch_baseline.py --out FILE.json [--presets a,b] [--tokens 1,4,...] [--ceilings-only]
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

PRESETS = {
    # name: (H, I, E, k, routing, activation, shared_I, n_group, topk_group, scale)
    "deepseek-v3": (7168, 2048, 256, 8, "deepseek", "swiglu", 2048, 8, 4, 2.5),
    "qwen3-235b": (4096, 1536, 128, 8, "softmax", "swiglu", 0, 1, 1, 1.0),
    "qwen3-30b": (2048, 768, 128, 8, "softmax", "swiglu", 0, 1, 1, 1.0),
    "gpt-oss-120b": (2880, 2880, 128, 4, "softmax", "swiglu", 0, 1, 1, 1.0),
    "nemotron-nano": (2688, 1856, 128, 6, "deepseek", "relu2", 3712, 1, 1, 2.5),
}
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384]
L2_BYTES = 60e6


def events_median_us(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def measure_ceilings(warm_s=3.0, repeats=3):
    dev = torch.device("cuda")
    n = 1 << 29  # 2 GiB of fp32
    x = torch.rand(n, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)
    acc = torch.empty((), device=dev, dtype=torch.float32)
    m = 8192
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    c = torch.empty(m, m, device=dev, dtype=torch.bfloat16)
    # The GPU first runs warm_s seconds of matmuls and reads: from idle (345 MHz) the 0.6 s ceilings-only call at
    # 45024a5 read 4.05 TB/s where 7aa6e2a's full run, measured after the GPU was busy, read 4.38. Then each
    # ceiling is measured `repeats` times (a median of 20 each) and the best is kept: at 55a99fa, after a 1 s
    # warm-up, single measurements of one machine's bf16 rate spread from 637 to 698 TFLOP/s
    # (bench/results/55a99fa-ceilings/). The best is the ceiling the hardware reached; every repeat is recorded.
    t_end = time.time() + warm_s
    while time.time() < t_end:
        torch.matmul(a, b, out=c)
        torch.sum(x, dim=0, out=acc)
        torch.cuda.synchronize()
    a8 = b8 = one = None
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device=dev, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        print(f"fp8 ceiling not measured: {e}", file=sys.stderr)
    runs = {"hbm_read_TBps": [], "d2d_copy_TBps": [], "bf16_TFLOPs": [], "fp8_TFLOPs": []}
    for _ in range(repeats):
        runs["hbm_read_TBps"].append(n * 4 / events_median_us(lambda: torch.sum(x, dim=0, out=acc), iters=20) / 1e6)
        runs["d2d_copy_TBps"].append(2 * n * 4 / events_median_us(lambda: y.copy_(x), iters=20) / 1e6)
        runs["bf16_TFLOPs"].append(2 * m**3 / events_median_us(lambda: torch.matmul(a, b, out=c), iters=20) / 1e6)
        if a8 is not None:
            try:
                us = events_median_us(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16), iters=20)
                runs["fp8_TFLOPs"].append(2 * m**3 / us / 1e6)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                print(f"fp8 ceiling not measured: {e}", file=sys.stderr)
                a8 = None
    del x, y, a, b, c, a8, b8
    torch.cuda.empty_cache()
    best = {k: (max(v) if v else None) for k, v in runs.items()}
    best["repeats"] = runs
    return best


def route(logits, bias, preset):
    H, I, E, k, routing, act, shared_I, n_group, topk_group, scale = preset
    if routing == "softmax":
        p = torch.softmax(logits.float(), dim=-1)
        w, ids = torch.topk(p, k, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        return ids, w
    s = torch.sigmoid(logits.float())
    sb = s + bias
    T = logits.shape[0]
    if n_group > 1:
        g = sb.view(T, n_group, E // n_group).topk(2, dim=-1).values.sum(-1)
        keep = g.topk(topk_group, dim=-1).indices
        mask = torch.zeros(T, n_group, device=logits.device, dtype=torch.bool).scatter_(1, keep, True)
        mask = mask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
        sb = sb.masked_fill(~mask, float("-inf"))
    ids = sb.topk(k, dim=-1).indices
    w = s.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True) * scale
    return ids, w


class Bf16Layer:
    """One MoE layer with bf16 weights, laid out as torch._grouped_mm wants (mat_b [E, K, N] column-major)."""

    def __init__(self, preset, gen):
        H, I, E, k, routing, act, shared_I, *_ = preset
        dev = torch.device("cuda")
        n1 = 2 * I if act == "swiglu" else I
        # [E, N, K] contiguous, transposed views -> [E, K, N] with stride(-2) == 1
        self.w13 = (torch.randn(E, n1, H, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02)
        self.w2 = (torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02)
        self.bias = torch.randn(E, device=dev, generator=gen) * 0.01
        self.shared13 = self.shared2 = None
        if shared_I:
            sn1 = 2 * shared_I if act == "swiglu" else shared_I
            self.shared13 = torch.randn(sn1, H, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02
            self.shared2 = torch.randn(H, shared_I, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02
        self.preset = preset

    def bytes(self):
        n = self.w13.numel() + self.w2.numel()
        if self.shared13 is not None:
            n += self.shared13.numel() + self.shared2.numel()
        return 2 * n

    def act(self, h, width):
        if self.preset[5] == "swiglu":
            return (F.silu(h[:, :width].float()) * h[:, width:].float()).to(torch.bfloat16)
        return torch.relu(h.float()).square().to(torch.bfloat16)

    def forward(self, x, logits):
        H, I, E, k, *_ = self.preset
        T = x.shape[0]
        ids, w = route(logits, self.bias, self.preset)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, device=x.device, dtype=torch.int32).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))  # graph-safe (bincount syncs)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        tok = order // k
        xs = x.index_select(0, tok)
        h = torch._grouped_mm(xs, self.w13.transpose(-2, -1), offs=offs)
        a = self.act(h, I)
        y = torch._grouped_mm(a, self.w2.transpose(-2, -1), offs=offs)
        yw = y.float() * w.reshape(-1).index_select(0, order).unsqueeze(1)
        out = torch.zeros(T, H, device=x.device, dtype=torch.float32).index_add_(0, tok, yw)
        if self.shared13 is not None:
            hs = x @ self.shared13.t()
            out += (self.act(hs, self.shared2.shape[1]) @ self.shared2.t()).float()
        return out


def bench_preset(name, tokens_list, skew, sink):
    """Times the preset at every T; each row goes to sink(row) as soon as it is measured."""
    preset = PRESETS[name]
    H, I, E, k, *_ = preset
    gen = torch.Generator(device="cuda").manual_seed(1234)
    probe = Bf16Layer(preset, gen)
    per_layer = probe.bytes()
    del probe
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    budget = free * 0.6
    layers_n = int(max(1, min(8, budget // per_layer)))
    layers = [Bf16Layer(preset, gen) for _ in range(layers_n)]
    for T in tokens_list:
        xs = [torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in layers]
        lg = []
        for _ in layers:
            logits = torch.randn(T, E, device="cuda", generator=gen)
            if skew:
                logits[:, :4] += 4.0  # a few hot experts
            lg.append(logits)
        try:
            for L, x, l in zip(layers, xs, lg):  # eager warm-up (also compiles/initializes kernels)
                L.forward(x, l)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for L, x, l in zip(layers, xs, lg):
                    L.forward(x, l)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                for L, x, l in zip(layers, xs, lg):
                    L.forward(x, l)
            us = events_median_us(graph.replay) / layers_n
            del graph
        except Exception as e:  # noqa: BLE001 - recorded in the JSON
            sink({"preset": name, "tokens": T, "skewed": skew, "error": str(e)[:300]})
            continue
        sink({"preset": name, "tokens": T, "skewed": skew, "layers_per_replay": layers_n,
                     "us_per_layer": us, "flops": 2 * T * k * 3 * H * I})
        print(f"torch baseline {name:14s} T={T:6d} {'skew' if skew else 'unif'} {us:10.1f} us/layer (L={layers_n})",
              flush=True)
        del xs, lg
    del layers
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--ceilings-only", action="store_true")
    ap.add_argument("--skewed", action="store_true", help="also run the skewed routing")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__}
    try:
        result["clocks"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        result["clocks"] = None
    t0 = time.time()
    result["ceilings"] = measure_ceilings()
    print("ceilings", json.dumps(result["ceilings"]), flush=True)
    rows = []
    result["torch_baseline"] = rows

    def save():  # after every preset: a timeout keeps what was measured
        result["seconds"] = time.time() - t0
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    save()
    if not args.ceilings_only:
        toks = [int(t) for t in args.tokens.split(",") if t]
        for name in args.presets.split(","):
            for skew in ([False, True] if args.skewed else [False]):
                try:
                    bench_preset(name, toks, skew, lambda row: (rows.append(row), save()))
                except Exception as e:  # noqa: BLE001 - one preset's failure (e.g. out of memory) is recorded
                    rows.append({"preset": name, "skewed": skew, "error": str(e)[:300]})
                    torch.cuda.empty_cache()
                save()
    save()


if __name__ == "__main__":
    main()
