#!/usr/bin/env bash
# One device call: the cuda layer suite, then compute-sanitizer (memcheck, racecheck, initcheck, synccheck)
# over a representative subset. Logs go to $OUT (default ./out). Binaries come from .carry/ (see the brief in
# tests/gpu-results/README or the commit message): .carry/test_cuda_layer.
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=${BIN:-./.carry/test_cuda_layer}
export LD_LIBRARY_PATH=$PWD/.carry:${LD_LIBRARY_PATH:-}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu-info.log"
status=0
timeout ${SUITE_TIMEOUT:-300} "$BIN" --gtest_color=no 2>&1 | tee "$OUT/cuda-layer.log" || status=1
SUB='Modes/ModeTest.AdversarialRouting/*:CudaLayer.BatchInvariance:CudaLayer.Calibration:CudaLayer.RefusalsLeaveNoStickyError:CudaLayer.GraphCaptureReplay'
for tool in memcheck racecheck initcheck synccheck; do
  filter=$SUB
  [ "$tool" = racecheck ] && filter='Modes/ModeTest.AdversarialRouting/w4a4:CudaLayer.Calibration'
  echo "=== compute-sanitizer --tool $tool --gtest_filter=$filter" | tee -a "$OUT/sanitizer.log"
  timeout ${SAN_TIMEOUT:-120} "$SAN" --tool $tool --error-exitcode 9 "$BIN" --gtest_color=no --gtest_brief=1 \
    --gtest_filter="$filter" 2>&1 | tail -n 25 | tee -a "$OUT/sanitizer.log"
  rc=${PIPESTATUS[0]}
  echo "=== $tool exit $rc" | tee -a "$OUT/sanitizer.log"
  [ "$rc" = 0 ] || status=1
done
exit $status
