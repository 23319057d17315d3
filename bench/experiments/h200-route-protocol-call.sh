# One device call (forty-first session): the group selection by one warp (warp_kept_groups, opt-in
# NVFP4MOE_ROUTE_WARP_GROUPS=1) tested, then the protocol with torch on the carried CLI (HEAD's figures of record; its
# default, the serial selection), then the switch's A/B in the same binary at deepseek-v3 T = 1 / 4, x19g's stamps
# inside route_block and x19f's per-warp dump (bench/experiments/x19g-route-stamps-on-d0d7287.patch), then ws8_s5_w24_b1
# against the default at deepseek-v3 T = 1 if time is left (before it, gemm_microbench's prefill_rows cases: the
# price of a narrow last prefill pass). Predictions: docs/benchmarks.md's optimisation log and docs/gemm.md.
# Carry: BASE_CLI=$(bash scripts/build_base_cli.sh 00484d9 | tail -1) VARIANT_BUILDS="x19:<x19g tree>/build" bash
# scripts/pack_carry.sh build (the x19g tree: d0d7287 + the patch, its nvfp4moe_cli built with -DNVFP4MOE_TESTS=OFF).
# Run as SHA=<sha> END_S=570 bash <this> (carry [".carry"]; needs_h200: deepseek-v3's prefill stack); on an H100:
# PROTOCOL=0 END_S=420 (no protocol).
set -u
source scripts/device_call_setup.sh  # the carry unpacked, W, left()
timeout 60 .carry/cuda_test_decode_route_kernels > $W/decode-route.log 2>&1; rc1=$?
echo "decode route tests: exit $rc1 [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/decode-route.log
# (the mixed last pass's layer test runs in its own call, bench/experiments/mixed-last-pass-call.sh: an untried
# kernel that hung would cost this suite)
timeout 150 .carry/cuda_test_cuda_layer --gtest_filter='-*PresetDims*:*MixedLastPass*' > $W/layer.log 2>&1; rc2=$?
echo "layer tests (no PresetDims): exit $rc2 [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer.log | head -8
timeout 60 env NVFP4MOE_ROUTE_WARP_GROUPS=1 .carry/cuda_test_cuda_layer \
  --gtest_filter='*RoutingAdversarial*:*T1RouteInGemm*:*TokensRoutedInGemm1*' > $W/layer-warp-groups-on.log 2>&1
echo "routing layer tests with NVFP4MOE_ROUTE_WARP_GROUPS=1: exit $? [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-warp-groups-on.log | head -4
if [ "${PROTOCOL:-1}" != 0 ]; then  # (PROTOCOL=0: no protocol; the rest fits an H100)
  pb=$(( $(left) - 230 )); [ $pb -gt 300 ] && pb=300
  SHA=${SHA:-unknown} BUDGET_S=$pb bash bench/protocol-call.sh
  echo "protocol: [$SECONDS s]"
fi
# (with a base CLI carried, 00484d9's: the bias loaded after the logit, for the bias-order A/B)
old=""; [ -x .carry/base/nvfp4moe ] && old="b00484d9:.carry/base/nvfp4moe"
VARIANTS="$old base:.carry/nvfp4moe groups:.carry/nvfp4moe:NVFP4MOE_ROUTE_WARP_GROUPS=1" \
  POINTS="${AB_POINTS:-deepseek-v3:1:w4a16,w4a4 deepseek-v3:4:w4a16}" \
  REPEAT=${AB_REPEAT:-1} NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$W/ab timeout $(( $(left) > 170 ? 100 : $(left) / 2 )) \
  bash scripts/device_variant_ab.sh | tee $W/ab.txt
echo "ab: [$SECONDS s]"
if [ $(left) -gt 25 ] && [ -x .carry/x19/nvfp4moe ]; then
  for preset in deepseek-v3 qwen3-30b; do
    timeout $(( $(left) > 40 ? 30 : 15 )) env NVFP4MOE_X19_REPLAYS=16 NVFP4MOE_X19_DUMP=$W/x19f-warps.txt \
      .carry/x19/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16 > $W/x19g-$preset-t1.log 2>&1
    echo "x19g $preset: exit $? [$SECONDS s]"
  done
  grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(0|1|2|4|5|8|14|15|16|17) " $W/x19g-*.log
  python3 bench/x19f_warp_tail.py $W/x19f-warps.txt > $W/x19f-tail.txt 2>&1; head -24 $W/x19f-tail.txt
  xz -9 $W/x19f-warps.txt
fi
# every expert at exactly R rows on the prefill tiles (gemm_microbench's prefill_rows cases, ~30 s): what a narrow
# last pass costs against a full one (docs/gemm.md, "Where this plan stands after the forty-second session")
if [ $(left) -gt 100 ] && [ -x .carry/gemm_microbench ]; then
  GEMM_MICROBENCH_ONLY=prefill_rows timeout 60 .carry/gemm_microbench $W/prefill-rows.jsonl > $W/prefill-rows.txt 2>&1
  echo "prefill_rows: exit $? [$SECONDS s]"; grep -E "ceilings|prefill_rows" $W/prefill-rows.txt
fi
# the 24-warp b1 GEMM1 (opt-in ws8_s5_w24_b1) against the default at deepseek-v3 T = 1, if time is left
[ $(left) -gt 45 ] && VARIANTS="base:.carry/nvfp4moe w24:.carry/nvfp4moe:NVFP4MOE_SM90_CONFIG=gemm1=ws8_s5_w24_b1" \
  POINTS="deepseek-v3:1:w4a16" REPEAT=2 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$W/ab-w24 \
  timeout $(( $(left) - 10 )) bash scripts/device_variant_ab.sh | tee $W/ab-w24.txt
tar czf $OUT/r.tgz -C $W . && rm -rf $W
echo "done [$SECONDS s]"
