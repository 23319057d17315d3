# T = 1 A/B of two changes against 64089e0 (base), H100 or H200 (whichever the call got), 2 repeats:
#   v1  = d663ada: the quantizing GEMM1s' piece range in 32-bit arithmetic (no 64-bit division subroutine);
#   new = SHA: v1 + the merged shared expert's GEMM1 pieces on the warps the T = 1 routing leaves idle, each first
#         prefetching its share of the expert's weights into L2 (Sm90OneTokenRoute::early_shared_route_warps);
#   off = SHA's CLI with NVFP4MOE_T1_EARLY_SHARED=0 (should time as v1).
# Predicted before the run: v1: w4a4 T = 1 -0.3..0.8 us at deepseek-v3 / qwen3-235b / qwen3-30b (experiment 19c:
# the routing -> first piece span is ~0.8 us longer than w4a16's, the range's 64-bit divisions in it), w4a16 equal;
# new: deepseek-v3 w4a16 T = 1 -2..5 us (the shared expert's GEMM1 16.5 MB streamed while the token is routed,
# ~6 us of idle HBM before the first k-tile), its w4a4 and the presets without a shared expert equal to v1.
# Then SHA's layer tests of the T = 1 paths (bitwise: the early shared expert against the routing launch and
# against every warp routing first, caller ids, graph replays), the w4a4 quantizing tests, PresetDims in both
# modes, and the decode routing kernels' suite (route_block's barrier now a template).
#   SHA=<sha> bash <this>   (carry [".carry"], packed with BASE_CLI=64089e0's CLI, VARIANT_BUILDS="v1:d663ada's")
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 170 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1RouteInGemm*:*T1BroadcastBitIdenticalToGather*:*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.PresetDims/w4a16:Modes/ModeTest.PresetDims/w4a4:Modes/ModeTest.AdversarialRouting/w4a16:Modes/ModeTest.AdversarialRouting/w4a4' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK' \$W/\$SHA-cuda-layer-subset.log
timeout 60 .carry/cuda_test_decode_route_kernels --gtest_color=no > \$W/\$SHA-decode-route.log 2>&1
echo \"decode-route exit \$?\"; grep -E '^\[  (PASSED|FAILED) ' \$W/\$SHA-decode-route.log" \
AB1_VARIANTS="base:.carry/base/nvfp4moe v1:.carry/v1/nvfp4moe new:.carry/nvfp4moe off:.carry/nvfp4moe:NVFP4MOE_T1_EARLY_SHARED=0" \
AB1_POINTS="deepseek-v3:1:w4a16,w4a4 qwen3-235b:1:w4a16,w4a4 qwen3-30b:1:w4a4" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=540 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
