#!/usr/bin/env python3
"""Merge one benchmark run into ONE JSON: our rows (`nvfp4moe bench --json`, one file per preset), the
ceilings and the torch bf16 baseline (bench/torch_baseline.py), GPU and clocks; per point the ratio
ours / baseline, decode efficiency = bytes / time / measured HBM read and prefill efficiency = flops / time /
measured dense bf16 (benchmarks.md). Prints a summary table and the targets; --markdown writes the table for
docs/benchmarks.md. Standard library only.

  merge_results.py --ours out/ours-*.json --torch out/torch.json [--torch out/torch_skewed.json]
                   [--gpu-info out/gpu-info.txt] --out bench/results/<sha>-bench.json [--markdown FILE]
  merge_results.py --compare OLD.json NEW.json [NEW2.json ...] [--threshold 0.03]
  merge_results.py --selftest

--compare lines up two runs (merged run files or raw `nvfp4moe bench --json` files, several NEW files for a
rerun written one per preset) point by point: new / old time, and "moved" where the ratio is beyond the
threshold AND the two p10-p90 ranges do not overlap (one point drifts ~3% between device calls).
"""
import argparse
import json
import os
import sys
import tempfile

TARGETS = {"decode_eff": 0.85, "qwen3_30b_t1_us": 12.0, "prefill_eff": 0.70}


def load(path):
    with open(path) as f:
        return json.load(f)


def merge(ours_paths, torch_paths, gpu_info_path=None):
    missing = [p for p in list(ours_paths) + list(torch_paths) if not os.path.exists(p)]
    for p in missing:
        print(f"merge_results: {p} does not exist (that step did not write it); left out", file=sys.stderr)
    ours_paths = [p for p in ours_paths if p not in missing]
    torch_paths = [p for p in torch_paths if p not in missing]
    ours_docs = [load(p) for p in ours_paths]
    torch_docs = [load(p) for p in torch_paths]
    # `bench --profile-eager --layers N < 8` times a stack the L2 can hold: never a protocol figure.
    for p, d in zip(ours_paths, ours_docs):
        if d.get("layers_below_protocol"):
            raise ValueError(f"merge_results: {p}: layers_requested {d.get('layers_requested')} < 8 "
                             "(a --profile-eager run): its timings are not the protocol's; leave it out")
    # Ceilings: every torch file of the run measured them (torch.json, torch_deepseek.json, torch_skewed.json);
    # each one is kept (ceilings_measured) and the run's ceiling is the best of them, per quantity: the rate the
    # hardware reached in this run, so no ratio is flattered by one slow measurement (at 55a99fa the first of the
    # run's three bf16 measurements read 637 TFLOP/s, the others 661 / 685; bench/results/55a99fa-ceilings/).
    ceilings_measured = [d["ceilings"] for d in torch_docs if d.get("ceilings")]
    torch_meta = next(({k: d.get(k) for k in ("gpu", "sm_count", "torch", "clocks", "seconds")}
                       for d in torch_docs if d.get("ceilings")), {})
    ceilings = None
    if ceilings_measured:
        keys = dict.fromkeys(k for c in ceilings_measured for k in c if k != "repeats")
        ceilings = {k: max((c[k] for c in ceilings_measured if isinstance(c.get(k), (int, float))), default=None)
                    for k in keys}
    baseline, baseline_errors = {}, []
    for d in torch_docs:
        for r in d.get("torch_baseline", []):
            key = (r["preset"], int(r["tokens"]), "skewed" if r.get("skewed") else "uniform")
            if "error" in r:
                baseline_errors.append(r)
                continue
            baseline.setdefault(key, r)  # the first file wins (torch.json before the skewed subset)
    rows, dropped, reduced, skipped, gpu, shas = [], [], [], [], None, set()
    for d in ours_docs:
        if d.get("skipped"):
            skipped.append(d)
            continue
        shas.add(d.get("git_sha", "unknown"))
        gpu = gpu or d.get("gpu")
        dropped += d.get("dropped", [])
        reduced += d.get("layers_reduced", [])
        for r in d.get("rows", []):
            if r.get("us_per_layer") is None:
                continue
            r = dict(r)
            us = float(r["us_per_layer"])
            b = baseline.get((r["preset"], int(r["tokens"]), r["routing"]))
            r["baseline_us"] = b["us_per_layer"] if b else None
            r["ratio_vs_baseline"] = us / b["us_per_layer"] if b else None  # < 1: we are faster
            if ceilings:
                r["decode_eff"] = r["bytes"] / (us * 1e-6) / (ceilings["hbm_read_TBps"] * 1e12)
                r["prefill_eff"] = r["flops"] / (us * 1e-6) / (ceilings["bf16_TFLOPs"] * 1e12)
            else:
                r["decode_eff"] = r["prefill_eff"] = None
            rows.append(r)
    order = {"deepseek-v3": 0, "qwen3-235b": 1, "qwen3-30b": 2, "gpt-oss-120b": 3, "nemotron-nano": 4}
    rows.sort(key=lambda r: (order.get(r["preset"], 9), r["preset"], r["mode"], r["routing"] != "uniform", r["tokens"]))
    gpu_info = None
    if gpu_info_path and os.path.exists(gpu_info_path):
        with open(gpu_info_path) as f:
            gpu_info = f.read()
    return {
        "git_sha": sorted(shas)[0] if len(shas) == 1 else sorted(shas),
        "gpu": gpu,
        "gpu_info": gpu_info,
        "torch": torch_meta,
        "ceilings": ceilings,
        "ceilings_measured": ceilings_measured,
        "efficiency_definitions": {
            "ratio_vs_baseline": "our us per layer / torch bf16 grouped-mm us per layer (same preset, T, routing kind)",
            "decode_eff": "bytes / time / measured HBM read bandwidth (ceilings.hbm_read_TBps)",
            "prefill_eff": "flops / time / measured dense bf16 (ceilings.bf16_TFLOPs); w4a4 also against bf16",
        },
        "rows": rows,
        "dropped": dropped,
        "layers_reduced": reduced,
        "skipped_presets": skipped,
        "baseline_rows": sorted(baseline.values(), key=lambda r: (r["preset"], r["tokens"], bool(r.get("skewed")))),
        "baseline_errors": baseline_errors,
        "sources": {"ours": list(ours_paths), "torch": list(torch_paths)},
    }


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(m):
    head = ["preset", "mode", "routing", "T", "us/layer", "p10-p90", "torch us", "ours/torch", "decode eff",
            "prefill eff", "experts", "L"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in m["rows"]:
        lines.append("| " + " | ".join([
            r["preset"], r["mode"], r["routing"], str(r["tokens"]), fmt(r["us_per_layer"], ".1f"),
            f"{r['p10']:.1f}-{r['p90']:.1f}", fmt(r.get("baseline_us"), ".1f"), fmt(r.get("ratio_vs_baseline"), ".3f"),
            fmt(r.get("decode_eff"), ".3f"), fmt(r.get("prefill_eff"), ".3f"), f"{r['experts_touched']:.1f}",
            str(r["layers"])]) + " |")
    return "\n".join(lines)


def targets(m):
    out = []
    rows = [r for r in m["rows"] if r["routing"] == "uniform"]
    dec = [r for r in rows if r["preset"] in ("deepseek-v3", "qwen3-235b") and r["tokens"] <= 64
           and r.get("decode_eff") is not None]
    if dec:
        worst = min(dec, key=lambda r: r["decode_eff"])
        out.append(f"decode (deepseek-v3, qwen3-235b, T <= 64) >= {TARGETS['decode_eff']} of HBM read: worst "
                   f"{worst['decode_eff']:.3f} ({worst['preset']} {worst['mode']} T={worst['tokens']}) -> "
                   f"{'MET' if worst['decode_eff'] >= TARGETS['decode_eff'] else 'not met'}")
    q = [r for r in rows if r["preset"] == "qwen3-30b" and r["tokens"] == 1]
    for r in q:
        out.append(f"qwen3-30b T=1 {r['mode']} <= {TARGETS['qwen3_30b_t1_us']} us: {r['us_per_layer']:.1f} us -> "
                   f"{'MET' if r['us_per_layer'] <= TARGETS['qwen3_30b_t1_us'] else 'not met'}")
    pre = [r for r in rows if r["preset"] == "deepseek-v3" and r["tokens"] >= 4096 and r.get("prefill_eff") is not None]
    for r in pre:
        out.append(f"prefill deepseek-v3 {r['mode']} T={r['tokens']} >= {TARGETS['prefill_eff']} of bf16: "
                   f"{r['prefill_eff']:.3f} -> {'MET' if r['prefill_eff'] >= TARGETS['prefill_eff'] else 'not met'}")
    if not pre:
        out.append("prefill deepseek-v3 T >= 4096: no measured point (dropped or not run)")
    cmp_ = [r for r in m["rows"] if r.get("ratio_vs_baseline") is not None]
    slower = [r for r in cmp_ if r["ratio_vs_baseline"] >= 1.0]
    # Every measured uniform point should have a baseline (torch runs them all): a cut or failed torch step shows
    # here instead of shrinking the count silently (55a99fa's first, cut, call compared 32 points of 88).
    unmatched = [r for r in m["rows"] if r["routing"] == "uniform" and r.get("us_per_layer") is not None
                 and r.get("ratio_vs_baseline") is None]
    out.append(f"faster than the torch bf16 baseline: {len(cmp_) - len(slower)} of {len(cmp_)} compared points"
               + (f"; slower at: " + ", ".join(f"{r['preset']} {r['mode']} {r['routing']} T={r['tokens']} "
                                              f"({r['ratio_vs_baseline']:.2f}x)" for r in slower[:12]) if slower else "")
               + (f"; {len(unmatched)} measured uniform points have no baseline (the torch step was cut or failed)"
                  if unmatched else ""))
    for d in m["dropped"]:
        out.append(f"dropped: {d['preset']} {d['mode']} {d['routing']} T={d['tokens']}: {d['reason']}")
    for d in m["layers_reduced"]:
        out.append(f"layers reduced: {d}")
    for d in m["skipped_presets"]:
        out.append(f"skipped: {d}")
    for e in m["baseline_errors"]:
        out.append(f"baseline error: {e['preset']} T={e['tokens']}: {e['error'][:120]}")
    return out


def point_key(r):
    return (r["preset"], r["mode"], r["routing"], int(r["tokens"]))


def compare(old_docs, new_docs, threshold=0.03):
    """Rows of the points both runs measured: (key, old us, new us, ratio, moved), and the per (preset, mode)
    geometric mean of the ratios. moved: |ratio - 1| > threshold and disjoint p10-p90 ranges."""
    def rows_of(docs):
        out = {}
        for d in docs:
            for r in d.get("rows", []):
                if r.get("us_per_layer") is not None:
                    out[point_key(r)] = r  # a later file wins (a rerun after the full run)
        return out
    old, new = rows_of(old_docs), rows_of(new_docs)
    rows, groups = [], {}
    for k in sorted(set(old) & set(new), key=lambda k: (k[0], k[1], k[2], k[3])):
        o, n = old[k], new[k]
        ratio = float(n["us_per_layer"]) / float(o["us_per_layer"])
        disjoint = (n.get("p90") is not None and o.get("p10") is not None and
                    (float(n["p90"]) < float(o["p10"]) or float(n["p10"]) > float(o["p90"])))
        moved = abs(ratio - 1.0) > threshold and disjoint
        rows.append((k, float(o["us_per_layer"]), float(n["us_per_layer"]), ratio, moved))
        groups.setdefault(k[:2], []).append(ratio)
    geo = {}
    for g, rs in groups.items():
        prod = 1.0
        for x in rs:
            prod *= x
        geo[g] = prod ** (1.0 / len(rs))
    return rows, geo


def compare_report(rows, geo, threshold):
    lines = [f"{len(rows)} common points; moved = beyond {threshold:.0%} with disjoint p10-p90 ranges"]
    for k, o, n, ratio, moved in rows:
        if moved:
            lines.append(f"  {'faster' if ratio < 1 else 'SLOWER'} {k[0]} {k[1]} {k[2]} T={k[3]}: {o:.1f} -> {n:.1f} us "
                         f"({ratio:.3f}x)")
    for g in sorted(geo):
        lines.append(f"  geomean {g[0]} {g[1]}: {geo[g]:.3f}x over {sum(1 for r in rows if r[0][:2] == g)} points")
    return lines


def selftest():
    tmp = tempfile.mkdtemp(prefix="nvfp4moe-merge-")
    ours = {"git_sha": "abc1234", "gpu": {"name": "FAKE"}, "rows": [
        {"preset": "qwen3-30b", "mode": "w4a16", "routing": "uniform", "tokens": 1, "layers": 8, "us_per_layer": 10.0,
         "p10": 9.0, "p90": 11.0, "bytes": 21e6, "flops": 2 * 8 * 3 * 2048 * 768, "experts_touched": 8.0},
        {"preset": "qwen3-30b", "mode": "w4a16", "routing": "skewed", "tokens": 1, "layers": 8, "us_per_layer": 20.0,
         "p10": 19.0, "p90": 21.0, "bytes": 21e6, "flops": 1.0, "experts_touched": 8.0},
        {"preset": "qwen3-30b", "mode": "w4a4", "routing": "uniform", "tokens": 4, "layers": 8, "us_per_layer": None,
         "p10": None, "p90": None, "bytes": 1, "flops": 1, "experts_touched": 1}],
        "dropped": [{"preset": "qwen3-30b", "mode": "w4a4", "routing": "uniform", "tokens": 16384, "reason": "budget"}],
        "layers_reduced": []}
    torch_ = {"gpu": "FAKE", "ceilings": {"hbm_read_TBps": 4.2, "d2d_copy_TBps": 4.3, "bf16_TFLOPs": 700.0,
                                          "fp8_TFLOPs": 1250.0},
              "torch_baseline": [{"preset": "qwen3-30b", "tokens": 1, "skewed": False, "us_per_layer": 100.0},
                                 {"preset": "qwen3-30b", "tokens": 4, "skewed": False, "error": "boom"}]}
    skew = {"ceilings": {"hbm_read_TBps": 1.0, "bf16_TFLOPs": 750.0, "repeats": {"bf16_TFLOPs": [740.0, 750.0]}},
            "torch_baseline": [{"preset": "qwen3-30b", "tokens": 1, "skewed": False, "us_per_layer": 999.0},
                               {"preset": "qwen3-30b", "tokens": 1, "skewed": True, "us_per_layer": 80.0}]}
    paths = {}
    for name, doc in (("ours", ours), ("torch", torch_), ("skew", skew)):
        paths[name] = os.path.join(tmp, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(doc, f)
    skipped = os.path.join(tmp, "ours-x.skipped.json")
    with open(skipped, "w") as f:
        json.dump({"preset": "x", "skipped": "no time left"}, f)
    m = merge([paths["ours"], skipped], [paths["torch"], paths["skew"]])
    assert len(m["rows"]) == 2, m["rows"]
    u, s = m["rows"]
    assert u["routing"] == "uniform" and s["routing"] == "skewed"
    assert abs(u["ratio_vs_baseline"] - 0.1) < 1e-12  # 10 us vs 100 us (torch.json wins over the duplicate)
    assert abs(s["ratio_vs_baseline"] - 0.25) < 1e-12
    assert abs(u["decode_eff"] - 21e6 / 10e-6 / 4.2e12) < 1e-12
    # the run's ceiling is the best measurement per quantity (bf16 from the second file, HBM read from the first)
    assert abs(u["prefill_eff"] - u["flops"] / 10e-6 / 750e12) < 1e-12
    assert m["ceilings"]["hbm_read_TBps"] == 4.2 and m["ceilings"]["bf16_TFLOPs"] == 750.0
    assert m["ceilings"]["d2d_copy_TBps"] == 4.3 and "repeats" not in m["ceilings"]
    assert len(m["ceilings_measured"]) == 2 and m["git_sha"] == "abc1234"
    assert len(m["baseline_errors"]) == 1 and len(m["dropped"]) == 1 and len(m["skipped_presets"]) == 1
    t = targets(m)
    assert any("qwen3-30b T=1 w4a16" in x and "MET" in x for x in t), t
    assert not any("no baseline" in x for x in t), t
    cut_torch = os.path.join(tmp, "cut.json")  # a cut torch step: only the skewed row, no uniform baseline
    with open(cut_torch, "w") as f:
        json.dump({"ceilings": skew["ceilings"], "torch_baseline": [skew["torch_baseline"][1]]}, f)
    cut = targets(merge([paths["ours"]], [cut_torch]))
    assert any("1 of 1 compared points; 1 measured uniform points have no baseline" in x for x in cut), cut
    assert "| qwen3-30b | w4a16 | uniform | 1 | 10.0 |" in table(m)
    profiled = os.path.join(tmp, "ours-profiled.json")  # bench --profile-eager --layers 1: refused by name
    with open(profiled, "w") as f:
        json.dump(dict(ours, layers_requested=1, layers_below_protocol=True), f)
    try:
        merge([paths["ours"], profiled], [paths["torch"]])
        raise AssertionError("a --layers 1 document was merged")
    except ValueError as e:
        assert "ours-profiled.json: layers_requested 1 < 8" in str(e), e
    # compare: a clear speed-up, a change inside the spread, a slow-down with overlapping ranges, a new point.
    def row(t, us, p10, p90):
        return {"preset": "p", "mode": "w4a16", "routing": "uniform", "tokens": t, "us_per_layer": us, "p10": p10,
                "p90": p90}
    old_run = {"rows": [row(1, 100.0, 99.0, 101.0), row(4, 100.0, 99.0, 101.0), row(16, 100.0, 95.0, 120.0)]}
    new_run = {"rows": [row(1, 80.0, 79.0, 81.0), row(4, 101.0, 100.0, 102.0), row(16, 110.0, 105.0, 115.0),
                        row(64, 5.0, 5.0, 5.0)]}
    rerun = {"rows": [row(4, 90.0, 89.0, 91.0)]}  # a later file wins
    rows, geo = compare([old_run], [new_run, rerun], 0.03)
    got = {r[0][3]: (round(r[3], 6), r[4]) for r in rows}
    assert got == {1: (0.8, True), 4: (0.9, True), 16: (1.1, False)}, got
    assert abs(geo[("p", "w4a16")] - (0.8 * 0.9 * 1.1) ** (1 / 3)) < 1e-12
    rep = compare_report(rows, geo, 0.03)
    assert any("faster p w4a16 uniform T=1" in x for x in rep) and not any("T=16" in x for x in rep), rep
    print("merge_results selftest: OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", nargs="+", default=[])
    ap.add_argument("--torch", action="append", default=[])
    ap.add_argument("--gpu-info")
    ap.add_argument("--out")
    ap.add_argument("--markdown")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="OLD.json NEW.json [NEW2.json ...]")
    ap.add_argument("--threshold", type=float, default=0.03)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        selftest()
        return 0
    if a.compare:
        if len(a.compare) < 2:
            ap.error(f"--compare: expected OLD.json and at least one NEW.json, got {len(a.compare)} file(s)")
        rows, geo = compare([load(a.compare[0])], [load(p) for p in a.compare[1:]], a.threshold)
        print("\n".join(compare_report(rows, geo, a.threshold)))
        return 0
    if not a.ours or not a.out:
        ap.error("--ours and --out are required")
    try:
        m = merge(a.ours, a.torch, a.gpu_info)
    except ValueError as e:  # (a document that must not be merged, named in the message)
        print(e, file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(m, f, indent=1)
    c = m["ceilings"] or {}
    head = (f"git {m['git_sha']}  GPU {(m['gpu'] or {}).get('name')}  ceilings: HBM read {c.get('hbm_read_TBps', 0):.2f} "
            f"TB/s, copy {c.get('d2d_copy_TBps', 0):.2f} TB/s, bf16 {c.get('bf16_TFLOPs', 0):.0f} TFLOP/s, fp8 "
            f"{(c.get('fp8_TFLOPs') or 0):.0f} TFLOP/s")
    tab = table(m)
    tg = targets(m)
    print(head)
    print(tab)
    print("\n".join(tg))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(head + "\n\n" + tab + "\n\n" + "\n".join("- " + x for x in tg) + "\n")
    print(f"wrote {a.out}" + (f" and {a.markdown}" if a.markdown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
