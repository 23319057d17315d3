#!/usr/bin/env bash
# ONE device call step: where a prefill layer's time goes under near-uniform against balanced routing (the
# question of docs/gemm.md "Partial token tiles at prefill": balanced routing is ~24% faster at deepseek-v3
# T = 4096). For each routing, Nsight Compute over the kernels of the CLI bench's first (eager) forward:
# duration, SM active cycles avg / max (the spread of the persistent tile schedule) and the tensor pipe's
# active share; then the bench itself with both GEMMs forced to bt128 and to bt144 (balanced: one tile per
# expert either way, so the time ratio is the cost of 144 against 128 columns per weight pass).
#   DIAG_PRESET=deepseek-v3 DIAG_TOKENS=4096 DIAG_MODE=w4a16 [DIAG_BENCH_ROUTINGS="balanced uniform"] OUT=out \
#   bash scripts/device_prefill_diag.sh
# Output under $OUT: ncu-<routing>.csv, bench-<routing>-<config>.{json,log}, diag-summary.txt.
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
PRESET=${DIAG_PRESET:-deepseek-v3}
TOKENS=${DIAG_TOKENS:-4096}
MODE=${DIAG_MODE:-w4a16}
CLI=$CARRY/nvfp4moe
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S=$OUT/diag-summary.txt
: > "$S"
KERNELS='regex:route|plan_|gather|grouped_gemm|combine|chained|warp_stream'
METRICS=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min
METRICS=$METRICS,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
for routing in uniform balanced; do
  timeout 150 "$NCU" --clock-control none --kernel-name "$KERNELS" --launch-count 16 --metrics "$METRICS" --csv \
    "$CLI" bench --preset "$PRESET" --tokens "$TOKENS" --mode "$MODE" --routing "$routing" --iters 1 --warmup 1 \
    > "$OUT/ncu-$routing.csv" 2> "$OUT/ncu-$routing.err"
  echo "ncu $routing: exit $?" >> "$S"
  # Kernel, metric, value: one line per (launch, metric), kernel names shortened to their function.
  python3 - "$OUT/ncu-$routing.csv" >> "$S" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit(0)
h = rows[0]
ik, im, iv = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
iid = h.index("ID")
for r in rows[1:]:
    name = r[ik].split("(")[0].split("<")[0].split("::")[-1] + ("<" + r[ik].split("<", 1)[1].split(">")[0] + ">" if "<" in r[ik] else "")
    print(f"  {r[iid]:>3} {name[:70]:70s} {r[im]:62s} {r[iv]}")
EOF
done
for routing in ${DIAG_BENCH_ROUTINGS:-balanced}; do
  for cfg in bt128_s8_wg2 bt144_s8_wg2; do
    b=$OUT/bench-$routing-$cfg
    timeout 120 env NVFP4MOE_SM90_CONFIG=$cfg "$CLI" bench --preset "$PRESET" --tokens "$TOKENS" --mode "$MODE" \
      --routing "$routing" --json "$b.json" > "$b.log" 2>&1
    echo "bench $routing $cfg: exit $? $(grep -E 'us/layer' "$b.log" | tr '\n' ' ')" >> "$S"
  done
done
cat "$S"
