# One device call (fortieth session): the 24-warp one-block-a-warp GEMM1 (ws8_s5_w24_b1, opt-in) tested and
# measured at T = 1 against the default (deepseek-v3: ws8_s6_w16_u, 1152 pieces; qwen3-235b: ws8_s6_w16_b1).
# Prediction: docs/benchmarks.md's optimisation log (deepseek-v3 T = 1 -3..-8 us on the H200, -1..-4 on an H100).
# Carry: the HEAD build (cmake --build build; bash scripts/pack_carry.sh build; add VARIANT_BUILDS="x19:<x19f tree>/build"
# for the optional x19f step). Run as SHA=<sha> END_S=400 bash <this> (carry [".carry"]); a short budget:
# END_S=150 AB_REPEAT=1 AB_POINTS=deepseek-v3:1:w4a16,w4a4 LAYER_TESTS='*T1TwentyFourWarpB1*'.
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
END=${END_S:-400}
left() { echo $(( END - SECONDS )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
timeout 120 .carry/cuda_test_cuda_layer \
  --gtest_filter="${LAYER_TESTS:-*T1TwentyFourWarpB1*:*T1RouteInGemmBitIdentical*:*T1W4A4QuantizedRows*}" \
  > $W/layer-w24.log 2>&1
echo "layer tests: exit $? [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" $W/layer-w24.log | head -8
VARIANTS="base:.carry/nvfp4moe w24:.carry/nvfp4moe:NVFP4MOE_SM90_CONFIG=gemm1=ws8_s5_w24_b1" \
  POINTS="${AB_POINTS:-deepseek-v3:1:w4a16,w4a4 qwen3-235b:1:w4a16,w4a4}" REPEAT=${AB_REPEAT:-2} \
  NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$W/ab timeout $(( $(left) > 260 ? 200 : $(left) > 50 ? $(left) - 20 : 30 )) \
  bash scripts/device_variant_ab.sh | tee $W/ab.txt
echo "ab: [$SECONDS s]"
[ $(left) -gt 60 ] && { timeout $(( $(left) - 15 )) .carry/cuda_test_sm90_grouped_gemm > $W/gemm-all.log 2>&1; \
  echo "gemm suite: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|UNSTABLE" $W/gemm-all.log | head -12; }
[ $(left) -gt 50 ] && [ -x .carry/x19/nvfp4moe ] && { timeout $(( $(left) - 10 )) env NVFP4MOE_X19_REPLAYS=16 \
  NVFP4MOE_X19_DUMP=$W/x19f-warps.txt .carry/x19/nvfp4moe bench --preset deepseek-v3 --tokens 1 --mode w4a16 \
  > $W/x19-deepseek-v3-t1.log 2>&1; echo "x19f: exit $? [$SECONDS s]"; \
  python3 bench/x19f_warp_tail.py $W/x19f-warps.txt > $W/x19f-tail.txt 2>&1; head -30 $W/x19f-tail.txt; \
  xz -9 $W/x19f-warps.txt; }
echo "done [$SECONDS s]"
tar czf $OUT/logs.tgz -C $W . && cp $W/ab.txt $W/gpu.txt $OUT/ 2>/dev/null
