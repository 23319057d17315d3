#!/usr/bin/env bash
# ONE device call for every GPU suite, on binaries built here and carried in .carry/ (nothing is built for the
# C++ suites on the device): the cuda layer, the sm90 grouped GEMM, the GPU weight quantizer (+ its timing of
# a deepseek-v3-shaped layer on the GPU and on the CPU), the stress suite, compute-sanitizer over a subset,
# then the Python package built there against its torch (scripts/device_python_gpu.sh) and a CLI smoke run.
# Each step has its own timeout so that one hang cannot eat the call; logs are written to $OUT as
# <sha>-<suite>.log and, at the end, packed into $OUT/<sha>-gpu-logs.tgz next to $OUT/<sha>-summary.log.
#
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_gpu_suite.sh
# Env: CARRY (.carry), STEPS (default "layer gemm quant stress sanitizer python cli"), BUDGET_S (optional: seconds
# this script may use in all: each step's (or sanitizer run's) time limit is cut to what is left of it, and a step
# with under 20 s left is skipped with a "skipped (budget)" line, so that the logs are packed before the device
# call's limit instead of lost), SANITIZE_GROUPS (which sanitizer groups the sanitizer step runs, in this order:
# default "wsgathered gathered dynamic layer tiles chained": the kernels never sanitized first).
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
STEPS=${STEPS:-layer gemm quant stress sanitizer python cli}
SANITIZE_GROUPS=${SANITIZE_GROUPS:-wsgathered gathered dynamic layer tiles chained}
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
export NVFP4MOE_TEST_DATA=$PWD/tests/data
export NVFP4MOE_CLI=$PWD/$CARRY/nvfp4moe
export NCCL_NVLS_ENABLE=0
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T0=$SECONDS
status=0
summary() { echo "[$(( SECONDS - T0 ))s] $*" | tee -a "$OUT/$SHA-summary.log"; }
limit=0
fits() {  # fits LIMIT NAME: sets $limit to LIMIT cut to what is left of BUDGET_S; false (and a summary line) under 20 s
  limit=$1
  [ -z "${BUDGET_S:-}" ] && return 0
  local rest=$(( BUDGET_S - (SECONDS - T0) ))
  [ "$rest" -lt "$limit" ] && limit=$rest
  [ "$limit" -ge 20 ] && return 0
  summary "$2: skipped (budget: ${BUDGET_S}s, $(( SECONDS - T0 ))s used)"
  status=1
  return 1
}
suite() {  # suite NAME TIMEOUT BINARY ARGS...
  local name=$1; fits "$2" "$1" || return 0
  shift 2
  timeout "$limit" "$@" --gtest_color=no > "$OUT/$SHA-$name.log" 2>&1
  local rc=$?
  summary "$name: exit $rc; $(grep -E '^\[  (PASSED|FAILED)  \]|tests ran' "$OUT/$SHA-$name.log" | tr '\n' ' ')"
  [ "$rc" = 0 ] || status=1
}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$OUT/$SHA-gpu-info.log" 2>&1
summary "git $SHA on $(head -2 "$OUT/$SHA-gpu-info.log" | tail -1)"

has layer && suite cuda-layer 240 "$CARRY/cuda_test_cuda_layer"
# The decode routing kernels' building blocks against their second forms (plan_one_token_block vs plan_small_block,
# rank_among_keys vs the short-circuit count) on the device.
has layer && suite decode-route-kernels 60 "$CARRY/cuda_test_decode_route_kernels"
has gemm && suite sm90-gemm 150 "$CARRY/cuda_test_sm90_grouped_gemm"
has quant && NVFP4MOE_QUANT_CPU_EXPERTS=${NVFP4MOE_QUANT_CPU_EXPERTS:-32} suite weight-quant 150 "$CARRY/cuda_test_weight_quant"
has stress && suite cuda-stress 240 "$CARRY/cuda_test_cuda_stress"

# The sanitizer step's groups (SANITIZE_GROUPS picks them and their order).
sanitize_layer() {  # the layer subset, every tool
  local SUB='Modes/ModeTest.AdversarialRouting/*:CudaLayer.BatchInvariance:CudaLayer.Calibration:CudaLayer.RefusalsLeaveNoStickyError:CudaLayer.GraphCaptureReplay'
  for tool in memcheck racecheck initcheck synccheck; do
    filter=$SUB
    [ "$tool" = racecheck ] && filter='Modes/ModeTest.AdversarialRouting/w4a4:CudaLayer.Calibration'
    echo "=== compute-sanitizer --tool $tool --gtest_filter=$filter" >> "$OUT/$SHA-cuda-sanitizer.log"
    max=120; [ "$tool" = racecheck ] && max=240  # racecheck of the layer subset: 119 s at 3d97e92, > 120 at 8404347
    fits $max "sanitizer $tool" || continue
    timeout $limit "$SAN" --tool $tool --error-exitcode 9 "$CARRY/cuda_test_cuda_layer" --gtest_color=no \
      --gtest_brief=1 --gtest_filter="$filter" 2>&1 | tail -n 25 >> "$OUT/$SHA-cuda-sanitizer.log"
    rc=${PIPESTATUS[0]}
    echo "=== $tool exit $rc" >> "$OUT/$SHA-cuda-sanitizer.log"
    summary "sanitizer $tool: exit $rc"
    [ "$rc" = 0 ] || status=1
  done
}
sanitize_tiles() {
  # The tile kernels with their stages reused (RealShapesDeterministic: K = 7168, 112 k-tiles through 8-14
  # stages; the first 3 tile launches, racecheck is slow). AdversarialOffsets never wraps the stages. Known to
  # report WAR pairs (TMA weight copy vs the consumers' shared loads) with any arrival scheme tried so far:
  # docs/gemm.md, "The wgmma consumers' stage release under racecheck".
  if fits 180 "sanitizer racecheck (tile kernels, stage reuse)"; then
    echo "=== compute-sanitizer --tool racecheck --kernel-name kns=sm90_nvfp4_grouped_gemm_kernel (RealShapesDeterministic)" \
      >> "$OUT/$SHA-cuda-sanitizer.log"
    timeout "$limit" "$SAN" --tool racecheck --kernel-name kns=sm90_nvfp4_grouped_gemm_kernel --launch-count 3 --error-exitcode 9 \
      "$CARRY/cuda_test_sm90_grouped_gemm" --gtest_color=no --gtest_brief=1 \
      --gtest_filter='Sm90GroupedGemm.RealShapesDeterministic' 2>&1 | tail -n 25 >> "$OUT/$SHA-cuda-sanitizer.log"
    rc=${PIPESTATUS[0]}
    echo "=== racecheck (tile kernels, stage reuse) exit $rc" >> "$OUT/$SHA-cuda-sanitizer.log"
    summary "sanitizer racecheck (tile kernels, stage reuse): exit $rc"
    [ "$rc" = 0 ] || status=1
  fi
}
sanitize_chained() {
  # The chained GEMM1 -> GEMM2 kernel (its own barriers and phases): every tool, instrumenting that kernel only.
  for tool in racecheck synccheck memcheck; do
    fits 120 "sanitizer $tool (chained kernel)" || continue
    echo "=== compute-sanitizer --tool $tool --kernel-name kns=chained --gtest_filter=CudaLayer.ChainedGemms*" \
      >> "$OUT/$SHA-cuda-sanitizer.log"
    timeout "$limit" "$SAN" --tool $tool --kernel-name kns=chained --error-exitcode 9 "$CARRY/cuda_test_cuda_layer" \
      --gtest_color=no --gtest_brief=1 --gtest_filter='CudaLayer.ChainedGemms*' 2>&1 | tail -n 25 \
      >> "$OUT/$SHA-cuda-sanitizer.log"
    rc=${PIPESTATUS[0]}
    echo "=== $tool (chained) exit $rc" >> "$OUT/$SHA-cuda-sanitizer.log"
    summary "sanitizer $tool (chained kernel): exit $rc"
    [ "$rc" = 0 ] || status=1
  done
}
# memcheck, synccheck and racecheck of the GEMM tests matching filter $1, named $2 in the logs. racecheck is
# recorded but not counted in the status: with stages reused (a grid of 1 CTA walks every tile) it reports the
# known WAR pairs of the TMA weight copy against the consumers' loads (docs/gemm.md), which any new report must be
# told apart from by reading the log.
gemm_sanitize() {
  local filter=$1 what=$2 tool
  for tool in memcheck synccheck racecheck; do
    fits 150 "sanitizer $tool ($what)" || continue
    echo "=== compute-sanitizer --tool $tool --gtest_filter=$filter" >> "$OUT/$SHA-cuda-sanitizer.log"
    timeout "$limit" "$SAN" --tool $tool --error-exitcode 9 "$CARRY/cuda_test_sm90_grouped_gemm" --gtest_color=no \
      --gtest_brief=1 --gtest_filter="$filter" 2>&1 | tail -n 25 >> "$OUT/$SHA-cuda-sanitizer.log"
    rc=${PIPESTATUS[0]}
    echo "=== $tool ($what) exit $rc" >> "$OUT/$SHA-cuda-sanitizer.log"
    summary "sanitizer $tool ($what): exit $rc"
    [ "$rc" = 0 ] || [ "$tool" = racecheck ] || status=1
  done
}
# The tile kernels' dynamic schedule (dc5bd99): the tile slot handed from the producer to the consumers through
# the stage's full barrier, the end slot, and the counter's claims and reset, back to back and in graph replays.
sanitize_dynamic() { gemm_sanitize 'Sm90GroupedGemm.DynamicSchedule*' 'dynamic tile schedule'; }
# The gathered-A kernels (sixteenth session): the producer warps' cp.async rows into the stages, their noinc
# arrivals on the full barrier and the consumers' proxy fence (docs/gemm.md, "GEMM1 without the gather kernel");
# racecheck's view of cp.async against the async-proxy wgmma reads is new.
sanitize_gathered() { gemm_sanitize 'Sm90GroupedGemm.GatheredA*' 'gathered A'; }
# The warp-streaming gathered-A kernels (eighteenth session): each warp's cp.async rows through the permutation,
# the next piece's look-ahead (its own cursor and entries), on grids of 1 and 3 CTAs (many pieces a warp).
sanitize_wsgathered() { gemm_sanitize 'Sm90GroupedGemm.WarpStreamGathered*' 'warp-streaming gathered A'; }
if has sanitizer; then
  for group in $SANITIZE_GROUPS; do
    case $group in
      layer|tiles|chained|dynamic|gathered|wsgathered) "sanitize_$group" ;;
      *) summary "sanitizer: unknown group '$group' in SANITIZE_GROUPS (expected layer, tiles, chained, dynamic, gathered or wsgathered)"
         status=1 ;;
    esac
  done
fi

if has python && fits 240 python; then
  OUT=$OUT NVFP4MOE_GIT_SHA=$SHA timeout "$limit" bash scripts/device_python_gpu.sh > "$OUT/$SHA-python-driver.log" 2>&1
  rc=$?
  summary "python: exit $rc; $(tail -n 1 "$OUT/$SHA-python-driver.log")"
  [ "$rc" = 0 ] || status=1
fi

if has cli && fits 120 cli; then
  {
    timeout 60 "$CARRY/nvfp4moe" demo --backend cuda
    timeout 60 "$CARRY/nvfp4moe" bench --preset qwen3-30b --tokens 1,64 --mode w4a16 --iters 50 --json "$OUT/$SHA-bench-smoke.json"
  } > "$OUT/$SHA-cuda-cli.log" 2>&1
  rc=$?
  summary "cli: exit $rc"
  [ "$rc" = 0 ] || status=1
fi
summary "done, status $status"
# The device tool brings back at most 8 files from $OUT: everything but the summary goes into one archive.
( cd "$OUT" && find . -maxdepth 1 -type f ! -name "$SHA-summary.log" ! -name "$SHA-gpu-logs.tgz" -printf '%P\n' \
    | tar czf "$SHA-gpu-logs.tgz" -T - --remove-files ) || true
exit $status
