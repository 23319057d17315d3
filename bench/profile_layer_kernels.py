#!/usr/bin/env python3
"""Where one forward's time goes: per-kernel GPU time of the cuda layer (torch.profiler / CUPTI) at a few T,
next to the CUDA-graph replay time of the whole forward, so that the gap (launch/dependency latency between
the kernels) and the kernel that dominates are measured rather than guessed.

Needs torch with CUDA and the nvfp4moe package (scripts/device_python_gpu.sh builds it on the H200).
  profile_layer_kernels.py --checkpoint DIR [--layer N] [--tokens 1,4,64] [--mode w4a16] [--json FILE]
A checkpoint of a preset's shape: `nvfp4moe gen --preset qwen3-30b --out DIR` (a few seconds per GB).
"""
import argparse
import collections
import dataclasses
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import nvfp4moe


def graph_replay_us(fn, iters=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--tokens", default="1,4,64")
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--forwards", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ck = nvfp4moe.Checkpoint(args.checkpoint)
    layer_index = args.layer if args.layer is not None else ck.moe_layers[0]
    spec = ck.spec(layer_index)
    tokens = [int(t) for t in args.tokens.split(",")]
    layer = nvfp4moe.MoeLayer(ck, layer_index, mode=args.mode, max_tokens=max(tokens), device="cuda")
    H, E = spec.hidden, spec.num_experts
    result = {"checkpoint": args.checkpoint, "spec": dataclasses.asdict(spec), "mode": args.mode, "gpu": torch.cuda.get_device_name(),
              "points": []}
    g = torch.Generator(device="cuda").manual_seed(1)
    for T in tokens:
        x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
        logits = torch.randn(T, E, device="cuda", generator=g)
        out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
        fwd = lambda: layer.forward(x, router_logits=logits, out=out)  # noqa: E731
        for _ in range(5):
            fwd()
        torch.cuda.synchronize()
        # Weights of one layer are re-read from L2 here (one layer, fixed routing): kernel times are an L2-warm
        # lower bound for the big GEMMs of small layers; the split between kernels is what this is for.
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.forwards):
                fwd()
            torch.cuda.synchronize()
        per_kernel = collections.defaultdict(float)
        for ev in prof.events():  # the device-side events are the kernels and copies themselves
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[ev.name] += ev.time_range.elapsed_us() / args.forwards
        if not per_kernel:
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
        kernels = sorted(per_kernel.items(), key=lambda kv: -kv[1])
        replay = graph_replay_us(fwd)
        total = sum(v for _, v in kernels)
        print(f"T={T}: graph replay {replay:.1f} us; kernels {total:.1f} us; gap {replay - total:.1f} us")
        for name, us in kernels:
            print(f"   {us:8.2f} us  {name[:110]}")
        result["points"].append({"tokens": T, "graph_replay_us": replay, "kernel_sum_us": total,
                                 "kernels": [{"name": n, "us": u} for n, u in kernels]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
