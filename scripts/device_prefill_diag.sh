#!/usr/bin/env bash
# ONE device call step: where a layer's time goes, kernel by kernel, for a few cases (the question of
# docs/gemm.md "Partial token tiles at prefill": balanced routing is ~20% faster at deepseek-v3 T = 4096, and a
# quantizing GEMM1 at bt144 is slower than at bt128 on the qwen3 presets). For each case, Nsight Compute over the
# kernels of the CLI bench's first eager forward only (`bench --profile-eager`, ncu --profile-from-start off):
# duration, SM active cycles avg / max / min (the spread of the persistent tile schedule), the tensor pipe's
# active share, instructions and issue activity. Then, optionally, benches with a config forced.
#   DIAG_CASES="deepseek-v3:4096:w4a16:uniform: qwen3-30b:4096:w4a4:uniform:gemm1=bt128_s8_wg2" \
#   DIAG_BENCHES="deepseek-v3:4096:w4a16:balanced:bt144_s8_wg2" OUT=out bash scripts/device_prefill_diag.sh
# A case is preset:T:mode:routing:NVFP4MOE_SM90_CONFIG[:ENV] (config empty: the heuristic's configs; ENV: more
# settings for that case, several separated by ';', e.g. NVFP4MOE_DYNAMIC_TILES=0 for the static tile schedule).
# Output under $OUT: ncu-<case>.csv, bench-<case>.{json,log}, diag-summary.txt.
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
CLI=$CARRY/nvfp4moe
CASES=${DIAG_CASES:-deepseek-v3:4096:w4a16:uniform: deepseek-v3:4096:w4a16:balanced:}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S=$OUT/diag-summary.txt
: > "$S"
METRICS=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min
METRICS=$METRICS,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
METRICS=$METRICS,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
# DRAM bytes per launch: whether a schedule re-reads weights that CTAs running together would share through L2.
METRICS=$METRICS,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
# The L2's own load (% of its peak sector throughput): whether the stages' token tiles, re-read for every weight
# n-tile, are near what the L2 can deliver (the ping-pong question, docs/gemm.md "The consumer stagger").
METRICS=$METRICS,lts__t_sectors.avg.pct_of_peak_sustained_elapsed
for c in $CASES; do
  IFS=: read -r preset tokens mode routing cfg extra <<< "$c"
  IFS=';' read -r -a extra_env <<< "${extra:-}"
  name=$(echo "$preset-$tokens-$mode-$routing-${cfg:-heuristic}${extra:+-$extra}" | tr '=,;' '___')
  # --cache-control none: ncu's default flushes the caches before each kernel, which made the one-CTA plan scan
  # read DRAM (28 us there, ~0 in the graph: docs/gemm.md).
  timeout 150 env NVFP4MOE_SM90_CONFIG="$cfg" "${extra_env[@]}" "$NCU" --clock-control none --cache-control none --profile-from-start off \
    --metrics "$METRICS" --csv "$CLI" bench --preset "$preset" --tokens "$tokens" --mode "$mode" \
    --routing "$routing" --iters 1 --warmup 1 --profile-eager > "$OUT/ncu-$name.csv" 2> "$OUT/ncu-$name.err"
  echo "ncu $name: exit $?" >> "$S"
  # One line per launch: kernel (function and template arguments), then its metrics.
  python3 - "$OUT/ncu-$name.csv" >> "$S" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit(0)
h = rows[0]
ik, im, iv, iid = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
short = {"gpu__time_duration.sum": "ns", "sm__cycles_active.avg": "act_avg", "sm__cycles_active.max": "act_max",
         "sm__cycles_active.min": "act_min", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor%",
         "smsp__inst_executed.sum": "inst", "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
         "dram__bytes_read.sum": "dram_rd", "lts__t_sector_hit_rate.pct": "l2_hit%",
         "lts__t_sectors.avg.pct_of_peak_sustained_elapsed": "l2_load%"}
launches = {}
for r in rows[1:]:
    k = r[ik]
    fn = k.split("(")[0].split("<")[0].split("::")[-1]
    targs = "<" + k.split("<", 1)[1].split(">(")[0] + ">" if "<" in k.split("(")[0] else ""
    launches.setdefault(r[iid], [fn + targs, {}])[1][short.get(r[im], r[im])] = r[iv].replace(",", "")
total = 0.0
for i, (name, m) in sorted(launches.items(), key=lambda x: int(x[0])):
    total += float(m.get("ns", 0))
    print(f"  {i:>3} {name[:64]:64s} " + " ".join(f"{k}={m[k]}" for k in short.values() if k in m))
print(f"  sum of kernel durations: {total / 1000:.1f} us")
EOF
done
for c in ${DIAG_BENCHES:-}; do
  IFS=: read -r preset tokens mode routing cfg extra <<< "$c"
  IFS=';' read -r -a extra_env <<< "${extra:-}"
  name=$(echo "$preset-$tokens-$mode-$routing-${cfg:-heuristic}${extra:+-$extra}" | tr '=,;' '___')
  timeout 120 env NVFP4MOE_SM90_CONFIG="$cfg" "${extra_env[@]}" "$CLI" bench --preset "$preset" --tokens "$tokens" --mode "$mode" \
    --routing "$routing" --json "$OUT/bench-$name.json" > "$OUT/bench-$name.log" 2>&1
  echo "bench $name: exit $? $(grep -E 'us/layer' "$OUT/bench-$name.log" | tr '\n' ' ')" >> "$S"
done
cat "$S"
