# One call (thirty-second session): d814566 turned on GEMM2 reading GEMM1's T k ids with the two-slice config
# ws8_s4_w16_x2 (qwen3-235b T = 3 / 4, deepseek-v3 T = 2) after its bitwise test passed on 6ac16ea (H100). Runs the
# layer tests of the new default (the token-routing bitwise tests, w4a4 against the CPU reference), memcheck of the
# w4a16 one, then the A/B in one binary: base = NVFP4MOE_GEMM2_READS_TOKEN_IDS=0 (GEMM2 seeks: at these points,
# whose GEMM2 runs ws8_s4_w16_x2, exactly 6ac16ea's path) against the default (reads the ids). Run as
# SHA=<sha> bash <this> on a carry packed by scripts/pack_carry.sh after a full `cmake --build build` (its first run
# carried a CLI that was not relinked: bench/results/d814566-x2-ids-ab-h100-stale-cli/README.md).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
L=.carry/cuda_test_cuda_layer
timeout 120 $L --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/*' > $W/$SHA-$G-cuda-layer-tokens.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-tokens.log | tail -8
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $SAN --tool memcheck --error-exitcode 3 $L --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*' > $W/$SHA-$G-memcheck-tokens.log 2>&1
echo "memcheck rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-memcheck-tokens.log | tail -2
VARIANTS="base:.carry/nvfp4moe:NVFP4MOE_GEMM2_READS_TOKEN_IDS=0 x2ids:.carry/nvfp4moe" POINTS="qwen3-235b:3,4:w4a16,w4a4 deepseek-v3:2:w4a16,w4a4" \
  POINT_TIMEOUT_S=60 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout 150 bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
echo "[$SECONDS s] done"
(cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT
