#!/usr/bin/env python3
"""Roofline PNG from a merged benchmark JSON (bench/merge_results.py):
  left:   decode efficiency (bytes / time / measured HBM read) against T, target 0.85;
  middle: prefill efficiency (flops / time / measured dense bf16) against T, target 0.70;
  right:  the roofline itself: achieved TFLOP/s against arithmetic intensity (FLOP / byte the layer must
          read), under min(bf16 peak, HBM read x intensity) from the ceilings of the same run.
Uniform routing as lines (w4a16 solid, w4a4 dashed), skewed as open markers. Needs matplotlib (only this
script; nothing in CI does).

  plot_roofline.py bench/results/<sha>-bench.json --out docs/images/roofline-<sha>.png
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("merged")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_roofline: matplotlib is not installed; no plot", file=sys.stderr)
        return 0
    with open(a.merged) as f:
        m = json.load(f)
    rows = [r for r in m["rows"] if r.get("us_per_layer")]
    c = m.get("ceilings") or {}
    presets = []
    for r in rows:
        if r["preset"] not in presets:
            presets.append(r["preset"])
    colors = {p: plt.cm.tab10(i % 10) for i, p in enumerate(presets)}
    fig, ax = plt.subplots(1, 3, figsize=(18, 5.5))

    for i, (key, target, title) in enumerate((("decode_eff", 0.85, "decode: bytes / time / HBM read"),
                                              ("prefill_eff", 0.70, "prefill: FLOPs / time / dense bf16"))):
        for p in presets:
            for mode, ls in (("w4a16", "-"), ("w4a4", "--")):
                pts = sorted((r["tokens"], r[key]) for r in rows if r["preset"] == p and r["mode"] == mode
                             and r["routing"] == "uniform" and r.get(key) is not None)
                if pts:
                    ax[i].plot(*zip(*pts), ls, marker="o", ms=4, color=colors[p], label=f"{p} {mode}")
                sk = sorted((r["tokens"], r[key]) for r in rows if r["preset"] == p and r["mode"] == mode
                            and r["routing"] == "skewed" and r.get(key) is not None)
                if sk:
                    ax[i].plot(*zip(*sk), "o", mfc="none", color=colors[p], ms=6)
        ax[i].axhline(target, color="k", lw=0.8, ls=":")
        ax[i].text(1, target, f" target {target}", va="bottom", fontsize=8)
        ax[i].set_xscale("log", base=2)
        ax[i].set_xlabel("tokens T")
        ax[i].set_ylabel(key.replace("_", " "))
        ax[i].set_title(title)
        ax[i].grid(alpha=0.3)
    ax[0].legend(fontsize=7, ncol=2)

    r2 = ax[2]
    if c.get("bf16_TFLOPs") and c.get("hbm_read_TBps"):
        import math
        lo, hi = 0.1, 1e4
        xs = [lo * (hi / lo) ** (k / 200) for k in range(201)]
        r2.plot(xs, [min(c["bf16_TFLOPs"], c["hbm_read_TBps"] * x) for x in xs], "k-", lw=1,
                label=f"min(bf16 {c['bf16_TFLOPs']:.0f} TFLOP/s, HBM {c['hbm_read_TBps']:.2f} TB/s x I)")
        del math
    for p in presets:
        for mode, mk in (("w4a16", "o"), ("w4a4", "s")):
            pts = [(r["flops"] / r["bytes"], r["flops"] / (r["us_per_layer"] * 1e-6) / 1e12) for r in rows
                   if r["preset"] == p and r["mode"] == mode]
            if pts:
                r2.plot(*zip(*pts), mk, color=colors[p], ms=4, label=f"{p} {mode}")
    r2.set_xscale("log")
    r2.set_yscale("log")
    r2.set_xlabel("FLOP / byte (NVFP4 bytes the layer must read)")
    r2.set_ylabel("TFLOP/s")
    r2.set_title("roofline (ceilings measured in the same run)")
    r2.grid(alpha=0.3, which="both")
    r2.legend(fontsize=7)
    gpu = (m.get("gpu") or {}).get("name", "?")
    fig.suptitle(f"nvfp4moe whole MoE layer, git {m.get('git_sha')}, {gpu}: us per layer = CUDA-graph replay of "
                 f"L distinct layers / L")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
