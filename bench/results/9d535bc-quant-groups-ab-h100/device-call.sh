# The w4a4 T = 1 quantized rows by group (kWsQuantGroups = 4 named barriers: the CTA's idle warps arrive as they
# finish a group of k-tiles, the piece warps' first k-loop waits for each group before its first k-tile) against
# 744bfc6 (the idle warps quantize the whole rows, one barrier), H100, 2 repeats; then the new build's layer tests of
# the quantizing GEMM1s (bitwise against the gather, the every-warp-busy one-barrier path included), the w4a4 / w4a16
# reference tests, PresetDims in both modes (T = 1 against the CPU reference at the presets' dims) and racecheck /
# synccheck of the T = 1 w4a4 test (the named barriers).
# Predicted before the run: deepseek-v3 w4a4 T = 1 -0.3..1.0 us, qwen3-235b -0.2..0.8, qwen3-30b ±0.2 (its 13 idle
# warps already quantize in ~0.1 us), gpt-oss-120b / nemotron-nano -0..0.5; w4a16 and T = 4 unchanged (their kernels
# take the same k-loop through one more lambda).
#   SHA=<sha> bash <this>   (carry [".carry"], packed with BASE_CLI=/tmp/base744/build/nvfp4moe)
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 200 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:*T1BroadcastBitIdenticalToGather*:*T1RouteInGemm*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a*:Modes/ModeTest.AdversarialRouting/w4a*:Modes/ModeTest.PresetDims/w4a4:Modes/ModeTest.PresetDims/w4a16' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' \$W/\$SHA-cuda-layer-subset.log
S=\$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in synccheck racecheck; do
  timeout 90 \$S --tool \$tool .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*' > \$W/\$SHA-\$tool-t1w4a4.log 2>&1
  echo \"\$tool exit \$?\"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' \$W/\$SHA-\$tool-t1w4a4.log
done" \
AB1_VARIANTS="base:.carry/base/nvfp4moe new:.carry/nvfp4moe" \
AB1_POINTS="deepseek-v3:1:w4a4 qwen3-235b:1,4:w4a4 qwen3-30b:1:w4a16,w4a4 gpt-oss-120b:1:w4a4 nemotron-nano:1:w4a4" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=560 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
