# One call (thirty-second session): d814566 turned on GEMM2 reading GEMM1's T k ids with the two-slice config
# ws8_s4_w16_x2 (qwen3-235b T = 3 / 4, deepseek-v3 T = 2) after its bitwise test passed on 6ac16ea (H100). Through
# scripts/device_bundle.sh: the A/B in one binary, base = NVFP4MOE_GEMM2_READS_TOKEN_IDS=0 (GEMM2 seeks: at these
# points, whose GEMM2 runs ws8_s4_w16_x2, exactly 6ac16ea's path) against the default (reads the ids), then (EXTRA)
# the layer tests of the new default (token-routing bitwise tests, w4a4 against the CPU reference) and memcheck of
# the w4a16 one. Run as SHA=<sha> bash <this> on a carry packed by scripts/pack_carry.sh after a full
# `cmake --build build` (its first run carried a CLI that was not relinked:
# bench/results/d814566-x2-ids-ab-h100-stale-cli/README.md). Logs: $OUT/<sha>-logs.tgz, $OUT/<sha>-points.txt.
L=.carry/cuda_test_cuda_layer
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 120 $L --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/*' > \$W/\$SHA-cuda-layer-tokens.log 2>&1; echo \"layer exit \$?\"
grep -E 'PASSED|FAILED' \$W/\$SHA-cuda-layer-tokens.log | tail -3
timeout 60 $SAN --tool memcheck --error-exitcode 3 $L --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*' > \$W/\$SHA-memcheck-tokens.log 2>&1; echo \"memcheck exit \$?\"
grep -E 'ERROR SUMMARY' \$W/\$SHA-memcheck-tokens.log" \
AB1_VARIANTS="base:.carry/nvfp4moe:NVFP4MOE_GEMM2_READS_TOKEN_IDS=0 x2ids:.carry/nvfp4moe" \
AB1_POINTS="qwen3-235b:3,4:w4a16,w4a4 deepseek-v3:2:w4a16,w4a4" AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=300 \
NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
