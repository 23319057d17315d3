#!/usr/bin/env bash
# ONE device call from a compressed bundle of binaries built here: the CLI and the GPU test binaries each link
# the whole library (~11 MB of kernels apiece), so five of them do not fit the 64 MiB the device call carries;
# xz packs them ~4x. Build the bundle here with scripts/pack_carry.sh, carry .carry/, then on the device:
#
#   SUITE_STEPS="layer gemm" AB1_VARIANTS="base:.carry/base/nvfp4moe new:.carry/nvfp4moe" \
#   AB1_POINTS="deepseek-v3:4096:w4a16" NVFP4MOE_GIT_SHA=<sha> OUT=$OUT bash scripts/device_bundle.sh
#
# Steps, each optional: the GPU suites (scripts/device_gpu_suite.sh with STEPS=$SUITE_STEPS), then up to three
# A/B groups (scripts/device_variant_ab.sh with AB<i>_VARIANTS / AB<i>_POINTS / AB<i>_REPEAT / AB<i>_BENCH_ARGS),
# then EXTRA (a
# shell snippet, evaluated with $W the work folder). Everything lands
# in $OUT/work and is packed into $OUT/<sha>-logs.tgz (the device returns at most 8 files), beside the suites'
# summary and one line per measured point ($OUT/<sha>-points.txt).
# DEADLINE_S (default 570, for the device call's 600 s limit): every step is bounded so that the logs are packed
# before it: the suites get what is left (or SUITE_BUDGET_S if less) as their BUDGET_S (each step's limit cut to it),
# the A/B groups and EXTRA run under `timeout` with what is left, and a step with under 30 s left is skipped.
set -u -o pipefail
OUT=${OUT:-out}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
W=$OUT/work
mkdir -p "$W"
DEADLINE_S=${DEADLINE_S:-570}
T0=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - T0) - 25 )); }  # seconds a step may still take (25 s kept for packing)
for b in .carry/*.tar.xz; do [ -f "$b" ] && tar xJf "$b" -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry:${LD_LIBRARY_PATH:-}  # libgomp, which the device image may lack
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$W/gpu-info.txt" 2>&1
status=0
if [ -n "${SUITE_STEPS:-}" ]; then
  budget=$(left); [ -n "${SUITE_BUDGET_S:-}" ] && [ "$SUITE_BUDGET_S" -lt "$budget" ] && budget=$SUITE_BUDGET_S
  BUDGET_S=$budget STEPS=$SUITE_STEPS NVFP4MOE_GIT_SHA=$SHA OUT=$W/suites bash scripts/device_gpu_suite.sh \
    > "$W/suites-driver.log" 2>&1
  status=$?
  cp "$W/suites/$SHA-summary.log" "$OUT/" 2>/dev/null
fi
for i in 1 2 3; do
  v=AB${i}_VARIANTS p=AB${i}_POINTS r=AB${i}_REPEAT a=AB${i}_BENCH_ARGS
  [ -n "${!v:-}" ] || continue
  if [ "$(left)" -lt 30 ]; then echo "ab$i: skipped (deadline: $(( SECONDS - T0 ))s used of ${DEADLINE_S}s)" \
    | tee -a "$OUT/$SHA-points.txt"; continue; fi
  VARIANTS=${!v} POINTS=${!p} REPEAT=${!r:-1} BENCH_ARGS=${!a:-} NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab$i \
    timeout "$(left)" bash scripts/device_variant_ab.sh 2>&1 | tee -a "$OUT/$SHA-points.txt"
  [ "${PIPESTATUS[0]}" = 124 ] && echo "ab$i: stopped at the deadline" | tee -a "$OUT/$SHA-points.txt"
done
# EXTRA: one more shell snippet (e.g. a bench with --routing or a compute-sanitizer run), its output into $W.
if [ -n "${EXTRA:-}" ] && [ "$(left)" -lt 30 ]; then
  echo "extra: skipped (deadline: $(( SECONDS - T0 ))s used of ${DEADLINE_S}s)" | tee -a "$OUT/$SHA-points.txt"
elif [ -n "${EXTRA:-}" ]; then
  W=$W SHA=$SHA timeout "$(left)" bash -c "$EXTRA" > "$W/extra.log" 2>&1
  rc=$?
  echo "extra: exit $rc$([ "$rc" = 124 ] && echo ' (stopped at the deadline)')" | tee -a "$OUT/$SHA-points.txt"
  grep -hE "us/layer|SUMMARY|PASSED|FAILED| exit " "$W/extra.log" | tee -a "$OUT/$SHA-points.txt"
fi
( cd "$OUT" && tar czf "$SHA-logs.tgz" work --remove-files ) || true
exit "$status"
