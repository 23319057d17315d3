#!/usr/bin/env bash
# ONE device call for a change to the sm90 GEMM: its GPU tests first (the GEMM suite, the layer's sm90 tests,
# racecheck + synccheck of the GEMM tests in GEMM_SAN_FILTER), then the GEMM-only microbenchmark (quick mode)
# and a whole-layer A/B (scripts/device_variant_ab.sh with VARIANTS / POINTS / REPEAT) on the carried builds.
# Everything under $OUT is packed into $OUT/<sha>-check.tgz next to $OUT/<sha>-check-summary.log.
#   NVFP4MOE_GIT_SHA=<sha> VARIANTS=... POINTS=... OUT=out bash scripts/device_gemm_variant_check.sh
# Env: CARRY (.carry: cuda_test_* binaries, nvfp4moe, libgomp, mb/gemm_microbench_*), GEMM_SAN_FILTER,
# LAYER_FILTER, SKIP ("san mb ab": steps to leave out).
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT/check"
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
export NVFP4MOE_TEST_DATA=$PWD/tests/data NVFP4MOE_CLI=$PWD/$CARRY/nvfp4moe
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T0=$SECONDS
LOG=$OUT/$SHA-check-summary.log
note() { echo "[$(( SECONDS - T0 ))s] $*" | tee -a "$LOG"; }
skip() { case " ${SKIP:-} " in *" $1 "*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$LOG" 2>&1
status=0
gtest() {  # gtest NAME LIMIT BINARY ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" --gtest_color=no > "$OUT/check/$SHA-$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/check/$SHA-$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/check/$SHA-$name.log" | head -n 20 | tee -a "$LOG"
  [ "$rc" = 0 ] || status=1
}
gtest sm90-gemm 200 "$CARRY/cuda_test_sm90_grouped_gemm"
gtest cuda-layer-sm90 200 "$CARRY/cuda_test_cuda_layer" --gtest_filter="${LAYER_FILTER:-CudaLayer.Sm90*:CudaLayer.BatchInvariance*:CudaLayer.GraphCapture*}"
if ! skip san; then
  for tool in racecheck synccheck; do
    timeout 150 "$SAN" --tool $tool --error-exitcode 9 "$CARRY/cuda_test_sm90_grouped_gemm" --gtest_color=no \
      --gtest_brief=1 --gtest_filter="${GEMM_SAN_FILTER:-*SyncMma*}" > "$OUT/check/$SHA-gemm-$tool.log" 2>&1
    rc=$?
    note "gemm $tool (${GEMM_SAN_FILTER:-*SyncMma*}): exit $rc; $(tail -n 2 "$OUT/check/$SHA-gemm-$tool.log" | tr '\n' ' ')"
    [ "$rc" = 0 ] || status=1
  done
fi
if ! skip mb; then
  MB_DIR=$CARRY/mb OUT=$OUT/check NVFP4MOE_GIT_SHA=$SHA bash scripts/device_gemm_ab.sh > "$OUT/check/mb-driver.log" 2>&1
  note "microbench done"
  grep -hE "^(ceilings|case|decode|q30|prefill)" "$OUT"/check/*-mb-*.log >> "$LOG"
fi
if ! skip ab && [ -n "${VARIANTS:-}" ]; then
  OUT=$OUT/check NVFP4MOE_GIT_SHA=$SHA bash scripts/device_variant_ab.sh > "$OUT/check/ab-driver.log" 2>&1
  note "layer A/B done"
  cat "$OUT/check/ab-driver.log" >> "$LOG"
fi
note "done, tests status $status"
( cd "$OUT" && tar czf "$SHA-check.tgz" check --remove-files ) || true
exit $status
