# One call: the GPU tests of "GEMM1 routes T = 2 .. 4 tokens" (the new bitwise test, PresetDims w4a16 with T = 4
# against the CPU, the routing / graph / batch-invariance tests, memcheck of the new test), then the A/B of the
# same binary with NVFP4MOE_GEMM1_ROUTES_TOKENS=0 (the routing launch) against the default.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 240 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*:*T1RouteInGemm*:*GraphCapture*:*RoutingAdversarial*:*FusedRoutePlanGather*:*BatchInvariance*:*DeterministicAndPoison*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a16:Modes/ModeTest.AdversarialRouting/w4a16:Modes/ModeTest.PresetDims/w4a16' > $W/$SHA-$G-cuda-layer-subset.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-subset.log | tail -14
grep -B2 -A12 "Failure" $W/*.log | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 110 $SAN --tool memcheck --error-exitcode 3 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*' > $W/$SHA-$G-memcheck-tokens.log 2>&1
echo "memcheck rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-memcheck-tokens.log | tail -2
B=$(( ${END_S:-540} - SECONDS )); echo "[$SECONDS s] A/B budget $B"
VARIANTS="launch:.carry/nvfp4moe:NVFP4MOE_GEMM1_ROUTES_TOKENS=0 gemm1:.carry/nvfp4moe" \
POINTS="qwen3-235b:1,2,3,4:w4a16 qwen3-30b:1,2,3,4:w4a16 gpt-oss-120b:2,4:w4a16 nemotron-nano:2,4:w4a16 deepseek-v3:2,4:w4a16" \
  POINT_TIMEOUT_S=60 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $B bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
echo "[$SECONDS s] done"
(cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT
