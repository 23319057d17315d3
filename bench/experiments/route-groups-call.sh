# One device call (forty-first session): the grouped routing's group selection by one warp (warp_kept_groups, opt-in
# NVFP4MOE_ROUTE_WARP_GROUPS=1) tested and measured against the default in the same binary, plus x19g's stamps inside
# route_block on the base (bench/experiments/x19g-route-stamps-on-d0d7287.patch: x19f plus P14..P17 at route_block's
# barriers).
# Prediction: docs/benchmarks.md's optimisation log (deepseek-v3 T = 1 -1.5..2.0 us, T = 2 alike, T = 4 -1..2).
# Carry: BASE_CLI=$(bash scripts/build_base_cli.sh 00484d9 | tail -1) VARIANT_BUILDS="x19:<x19g tree>/build" bash
# scripts/pack_carry.sh build (the x19g tree: d0d7287 + the patch, its nvfp4moe_cli built with -DNVFP4MOE_TESTS=OFF).
# Run as SHA=<sha> END_S=560 bash <this> (carry [".carry"]; fits an H100: deepseek-v3 decode only).
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/r; mkdir -p $W
END=${END_S:-560}
left() { echo $(( END - SECONDS )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
timeout 60 .carry/cuda_test_decode_route_kernels > $W/decode-route.log 2>&1
echo "decode route tests: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/decode-route.log
timeout 150 .carry/cuda_test_cuda_layer --gtest_filter="${LAYER_TESTS:--*PresetDims*}" > $W/layer.log 2>&1
echo "layer tests (no PresetDims): exit $? [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer.log | head -8
timeout 60 env NVFP4MOE_ROUTE_WARP_GROUPS=1 .carry/cuda_test_cuda_layer \
  --gtest_filter='*RoutingAdversarial*:*T1RouteInGemm*:*TokensRoutedInGemm1*' > $W/layer-warp-groups-on.log 2>&1
echo "routing layer tests with NVFP4MOE_ROUTE_WARP_GROUPS=1: exit $? [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-warp-groups-on.log | head -4
# (with a base CLI carried, 00484d9's: the bias loaded after the logit, for the bias-order A/B)
old=""; [ -x .carry/base/nvfp4moe ] && old="b00484d9:.carry/base/nvfp4moe"
VARIANTS="$old base:.carry/nvfp4moe groups:.carry/nvfp4moe:NVFP4MOE_ROUTE_WARP_GROUPS=1" \
  POINTS="${AB_POINTS:-deepseek-v3:1:w4a16,w4a4 deepseek-v3:2:w4a16 deepseek-v3:4:w4a16 qwen3-30b:1:w4a16}" \
  REPEAT=${AB_REPEAT:-2} NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$W/ab timeout $(( $(left) > 330 ? 230 : $(left) / 2 )) \
  bash scripts/device_variant_ab.sh | tee $W/ab.txt
echo "ab: [$SECONDS s]"
if [ $(left) -gt 40 ] && [ -x .carry/x19/nvfp4moe ]; then
  for preset in deepseek-v3 qwen3-30b; do
    timeout 45 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16 \
      > $W/x19g-$preset-t1.log 2>&1
    echo "x19g $preset: exit $? [$SECONDS s]"
  done
  grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(0|1|2|4|5|8|14|15|16|17) " $W/x19g-*.log
fi
if [ $(left) -gt 70 ]; then
  timeout $(( $(left) - 20 )) .carry/cuda_test_cuda_layer --gtest_filter='*PresetDims*' > $W/layer-presetdims.log 2>&1
  echo "layer PresetDims: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-presetdims.log
fi
tar czf $OUT/r.tgz -C $W . && rm -rf $W
echo "done [$SECONDS s]"
