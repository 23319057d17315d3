# One call: the GPU tests of "GEMM2 reads GEMM1's T k ids" (the bitwise test of T = 2 .. 4 against the routing
# launch, now with GEMM2 seeking / reading after its wait / guessing; (PresetDims with T = 4 ran in a4ce642's call);
# T = 1 routing, graph capture, determinism; memcheck of the new test), then the A/B of the same
# binary: GEMM2 seeking (the default) / reading after the wait (NVFP4MOE_GEMM2_READS_TOKEN_IDS=1 with
# ..._GUESSES_TOKEN_IDS=0) / guessing (..._READS_TOKEN_IDS=1). Not run yet (twenty-eighth session: no device time
# left); run as SHA=<sha> END_S=330 bash <this script> with the carry packed (scripts/pack_carry.sh).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 150 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*:*T1RouteInGemm*:*GraphCapture*:*DeterministicAndPoison*:*BatchInvariance*' > $W/$SHA-$G-cuda-layer-subset.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-subset.log | tail -10
grep -B2 -A12 "Failure" $W/*.log | head -30
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck; do
  timeout 60 $SAN --tool $tool --error-exitcode 3 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*' > $W/$SHA-$G-$tool-tokens.log 2>&1
  echo "$tool rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-$tool-tokens.log | tail -2
done
B=$(( ${END_S:-300} - SECONDS )); echo "[$SECONDS s] A/B budget $B"
VARIANTS="seek:.carry/nvfp4moe read:.carry/nvfp4moe:NVFP4MOE_GEMM2_READS_TOKEN_IDS=1;NVFP4MOE_GEMM2_GUESSES_TOKEN_IDS=0 guess:.carry/nvfp4moe:NVFP4MOE_GEMM2_READS_TOKEN_IDS=1" \
POINTS="qwen3-235b:2,3,4:w4a16 qwen3-30b:2,3,4:w4a16 gpt-oss-120b:2,4:w4a16 deepseek-v3:2:w4a16" \
  POINT_TIMEOUT_S=60 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $B bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
echo "[$SECONDS s] done"
(cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT
