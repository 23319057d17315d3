#!/usr/bin/env bash
# ONE device call that first runs GPU suites on the carried binaries and then the whole-layer benchmark:
# on those binaries when every suite passed, otherwise on a fallback build (FALLBACK_BIN, a commit whose suites
# passed earlier), recorded as such in $OUT/bench-binary.txt, so that a failing new kernel costs no benchmark.
#   NVFP4MOE_GIT_SHA=<sha> FALLBACK_SHA=<sha> OUT=out bash scripts/device_validate_then_bench.sh
# Env: STEPS (suites, default "layer gemm sanitizer"; "none": no suites, for kernels a previous call validated),
# BENCH_BUDGET_S (default 400), DEADLINE_S (default 570: the suites get DEADLINE_S - BENCH_BUDGET_S - 30 s as
# their budget, a step cut by it counts as not passed), FALLBACK_BIN (.carry/prev/nvfp4moe), CARRY (.carry).
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT/suites" "$OUT/bench"
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
FALLBACK_BIN=${FALLBACK_BIN:-$CARRY/prev/nvfp4moe}
FALLBACK_SHA=${FALLBACK_SHA:-unknown}
STEPS=${STEPS:-layer gemm sanitizer}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-400}
# The binaries as scripts/pack_carry.sh packs them (xz); the first call of 55a99fa found none unpacked and ran
# nothing.
for b in "$CARRY"/*.tar.xz; do [ -f "$b" ] && tar xJf "$b" -C "$CARRY"; done
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}  # libgomp, which the device image may lack
if [ "$STEPS" = none ]; then
  suites=0
  echo "no suites in this call (STEPS=none: validated in an earlier call)" > "$OUT/suites-driver.log"
else
  BUDGET_S=$(( ${DEADLINE_S:-570} - BENCH_BUDGET_S - 30 )) STEPS=$STEPS NVFP4MOE_GIT_SHA=$SHA OUT=$OUT/suites \
    CARRY=$CARRY bash scripts/device_gpu_suite.sh > "$OUT/suites-driver.log" 2>&1
  suites=$?
fi
bin=$CARRY/nvfp4moe bench_sha=$SHA
if [ "$STEPS" = none ]; then
  echo "suites not run in this call (STEPS=none): benchmark on $bin" | tee "$OUT/bench-binary.txt"
elif [ "$suites" != 0 ]; then
  bin=$FALLBACK_BIN bench_sha=$FALLBACK_SHA
  echo "suites failed at $SHA (status $suites): benchmark on the fallback $bin ($FALLBACK_SHA)" | tee "$OUT/bench-binary.txt"
else
  echo "suites passed at $SHA: benchmark on $bin" | tee "$OUT/bench-binary.txt"
fi
OUT=$OUT/bench BIN=$bin NVFP4MOE_GIT_SHA=$bench_sha TOTAL_BUDGET_S=$BENCH_BUDGET_S \
  bash bench/run_device_bench.sh > "$OUT/bench-driver.log" 2>&1
# The device tool brings back at most 8 files: the summary, JSON, markdown and plot at the top, the rest packed.
cp "$OUT"/bench/bench-*.json "$OUT"/bench/summary-*.md "$OUT"/bench/roofline-*.png "$OUT" 2>/dev/null
cp "$OUT"/suites/*-summary.log "$OUT" 2>/dev/null
( cd "$OUT" && tar czf rest.tgz suites bench suites-driver.log bench-driver.log --remove-files ) || true
exit "$suites"
