# GEMM1 at T = 1 prefetching GEMM2's first k-tiles of every weight unit of its experts into L2 after its pieces
# (one bulk prefetch per (expert place, unit), issued by the first walkers of every CTA once they ran their pieces),
# one binary, NVFP4MOE_T1_PREFETCH_GEMM2_K_TILES = 0 (off) / 6 / 4096 (all of GEMM2), H100, 2 repeats; then the T = 1
# layer tests with 6 (the prefetch changes no result: the bitwise T = 1 tests, graph capture).
# Predicted before the run (experiment 19 on 44abfde: the HBM idles from GEMM1's median warp's end, 23.55 us at
# qwen3-235b w4a16, to GEMM2's median first k-tile, 28.88): with 6 k-tiles qwen3-235b T = 1 -0.5..2.0 us (both
# modes), qwen3-30b -0.3..1.0, gpt-oss-120b -0.3..1.5, deepseek-v3 -0..1.0; all of GEMM2 better than 6 only where
# GEMM2 is small against GEMM1's tail (qwen3-30b), worse at deepseek-v3 (its 75 MB GEMM2 through the 50 MB L2).
#   SHA=<sha> bash <this>   (carry [".carry"])
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data NVFP4MOE_T1_PREFETCH_GEMM2_K_TILES=6
timeout 120 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1RouteInGemm*:*T1W4A4QuantizedRows*:*T1BroadcastBitIdenticalToGather*:*GraphCaptureReplay*:*DeterministicAndPoisonProof*' > \$W/\$SHA-cuda-layer-t1-prefetch6.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' \$W/\$SHA-cuda-layer-t1-prefetch6.log" \
AB1_VARIANTS="off:.carry/nvfp4moe:NVFP4MOE_T1_PREFETCH_GEMM2_K_TILES=0 k6:.carry/nvfp4moe:NVFP4MOE_T1_PREFETCH_GEMM2_K_TILES=6 all:.carry/nvfp4moe:NVFP4MOE_T1_PREFETCH_GEMM2_K_TILES=4096" \
AB1_POINTS="qwen3-235b:1:w4a16,w4a4 qwen3-30b:1:w4a16,w4a4 gpt-oss-120b:1:w4a16 deepseek-v3:1:w4a16,w4a4" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=380 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
