# One device call: the C++ GPU suites of the carried build (the whole layer suite with PresetDims, the decode
# routing kernels, the sm90 GEMM suite, the stress suite), through scripts/device_gpu_suite.sh, on a carry packed
# by scripts/pack_carry.sh. Run as SHA=<sha> BUDGET_S=<s> bash scripts/device_suites_call.sh; the logs come back
# as $OUT/<sha>-gpu-logs.tgz and $OUT/<sha>-summary.log.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
NVFP4MOE_GIT_SHA=${SHA:-unknown} STEPS=${STEPS:-layer gemm stress} BUDGET_S=${BUDGET_S:-300} OUT=$OUT \
  bash scripts/device_gpu_suite.sh
cat $OUT/${SHA:-unknown}-summary.log
