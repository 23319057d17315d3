#!/usr/bin/env bash
# ONE device call: Nsight Compute on the sm90 grouped GEMMs of whole layers (the carried CLI's `bench`), to see
# where the consumer warps stall and which pipes are busy. For each case it profiles GEMM1 and GEMM2 of one
# forward (kernel replay, clocks left alone) and writes the details page and the per-SASS-instruction source
# page (stall samples per instruction) as text next to the .ncu-rep.
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_ncu_gemm.sh
# Env: CARRY (.carry), NCU_CASES (default "deepseek-v3:1 deepseek-v3:64 qwen3-30b:1").
# Output: $OUT/<sha>-ncu.tgz (reports + text pages) and $OUT/<sha>-ncu-summary.txt.
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
CASES=${NCU_CASES:-deepseek-v3:1 deepseek-v3:64 qwen3-30b:1}
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
D="$OUT/ncu"
mkdir -p "$D"
: > "$OUT/$SHA-ncu-summary.txt"
for c in $CASES; do
  preset=${c%%:*} tokens=${c##*:}
  name="$preset-t$tokens"
  # The bench builds its graph after one eager forward; skip nothing, take the first GEMM1 + GEMM2 pair.
  timeout 200 "$NCU" --clock-control none --kernel-name regex:sm90_nvfp4_grouped_gemm --launch-count 2 \
    --set full --import-source no -f -o "$D/$name" \
    "$CARRY/nvfp4moe" bench --preset "$preset" --tokens "$tokens" --iters 1 --warmup 0 --layers 8 \
    > "$D/$name.run.log" 2>&1
  echo "$name: ncu exit $?" >> "$OUT/$SHA-ncu-summary.txt"
  if [ -f "$D/$name.ncu-rep" ]; then
    "$NCU" --import "$D/$name.ncu-rep" --page details --print-units base > "$D/$name.details.txt" 2>&1
    "$NCU" --import "$D/$name.ncu-rep" --page source --print-source sass --csv > "$D/$name.source.csv" 2>&1
    grep -E "sm90_nvfp4|Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Memory Throughput" \
      "$D/$name.details.txt" >> "$OUT/$SHA-ncu-summary.txt"
  else
    tail -n 20 "$D/$name.run.log" >> "$OUT/$SHA-ncu-summary.txt"
  fi
done
( cd "$OUT" && tar czf "$SHA-ncu.tgz" ncu --remove-files ) || true
