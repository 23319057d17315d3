# One call: the GPU tests of w4a4's quantizing T = 1 GEMM1 (layer subset, sanitizers on the new test), the A/B
# (NVFP4MOE_T1_W4A4_QUANT_ROWS=0: the routing launch + gather / the new path), then the protocol in the time left
# (the whole one with torch on an H200; T = 1, 4 without torch on an H100, whose full run e15fe52 has).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
ok=1
timeout 170 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1*:*GraphCapture*:Modes/ModeTest.PresetDims/w4a4:Modes/ModeTest.PresetDims/w4a16:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:*Adversarial*:*FusedRoutePlanGather*:*Calibration*:*RefusalsLeaveNoStickyError*' > $W/$SHA-$G-cuda-layer-subset.log 2>&1; r=$?; echo "layer rc $r [$SECONDS s]"; tail -1 $W/$SHA-$G-cuda-layer-subset.log; [ $r = 0 ] || ok=0
grep -E "^\[  (FAILED|     OK) \].*T1W4A4" $W/$SHA-$G-cuda-layer-subset.log
grep -B2 -A10 "Failure" $W/*.log | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck; do
  timeout 75 $SAN --tool $tool --error-exitcode 3 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4*' > $W/$SHA-$G-$tool-t1w4a4.log 2>&1
  echo "$tool rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-$tool-t1w4a4.log | tail -2
done
echo "[$SECONDS s] tests ok=$ok"
if [ $ok = 1 ]; then
  VARIANTS="gather:.carry/nvfp4moe:NVFP4MOE_T1_W4A4_QUANT_ROWS=0 quant:.carry/nvfp4moe" \
  POINTS="deepseek-v3:1:w4a4 qwen3-235b:1:w4a4 qwen3-30b:1:w4a4 gpt-oss-120b:1:w4a4 nemotron-nano:1:w4a4 qwen3-30b:1:w4a16" POINT_TIMEOUT_S=30 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab \
    timeout 120 bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
  B=$(( ${END_S:-570} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
  if [ $G = h200 ]; then
    OUT=$OUT/p BIN=.carry/nvfp4moe NVFP4MOE_GIT_SHA=$SHA TOTAL_BUDGET_S=$B timeout $(( B + 20 )) bash bench/run_device_bench.sh > $W/bench-driver.log 2>&1
  else
    OUT=$OUT/p BIN=.carry/nvfp4moe NVFP4MOE_GIT_SHA=$SHA TOTAL_BUDGET_S=$B TOKENS=1,4 SKIP_TORCH=1 timeout $(( B + 20 )) bash bench/run_device_bench.sh > $W/bench-driver.log 2>&1
  fi
  echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
  mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
fi
(cd $OUT && tar czf rest.tgz v $( [ -d p ] && echo p ) && rm -rf v p); ls $OUT
