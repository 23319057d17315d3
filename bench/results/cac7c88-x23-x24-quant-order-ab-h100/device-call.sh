# Pending call (written in the thirty-third session, not yet run): experiments 23 and 24, the two orders of the w4a4
# quantizing GEMM1's row quantization (docs/gemm.md, "The w4a4 T = 1 residual on one time axis"; each changes only
# the 12 quantizing kernels, WsRows 3 and 6; the engine's 95 other kernels byte-identical in their cubins), A/B
# against the engine. Build here first, each in its own clone of HEAD (~2 minutes for the CLI and the layer test):
#   for x in 23 24; do git clone -q /work/main /tmp/x$x && cmake -S /tmp/x$x -B /tmp/x$x/build \
#     -DNVFP4MOE_SM90_EXPERIMENT=$x -DNVFP4MOE_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release \
#     && cmake --build /tmp/x$x/build --target nvfp4moe_cli cuda_test_cuda_layer -j2; done
#   cmake --build build && VARIANT_BUILDS="x23:/tmp/x23/build x24:/tmp/x24/build" bash scripts/pack_carry.sh build
# then SHA=<sha> bash <this> (carry [".carry"], ~200 s). First each variant's quantizing GEMM1 tests (bitwise
# against the gather path, both T = 1 and T = 2 .. 4, and w4a4 against the CPU reference), then the A/B, 2 repeats.
# Predicted (before any run; H100): x23 deepseek-v3 / qwen3-235b w4a4 T = 1 -0.5..1.5 us (the quantization at the
# idle warps' ~0.3 us, the first weights' round trip then after it), qwen3-235b T = 4 ±1; x24 deepseek-v3 -0.5..1.5,
# qwen3-30b -0.3..1 (13 idle warps), qwen3-235b T = 1 -0.5..+1 (only 4 idle warps under b1's pairs), T = 4 +0..2
# (few idle warps for 8 rows). w4a16 unchanged (its kernels identical).
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
for x in x23 x24; do
  timeout 100 .carry/\$x/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/w4a4' > \$W/\$SHA-\$x-cuda-layer-w4a4.log 2>&1
  echo \"\$x layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) ' \$W/\$SHA-\$x-cuda-layer-w4a4.log
done" \
AB1_VARIANTS="base:.carry/nvfp4moe x23:.carry/x23/nvfp4moe x24:.carry/x24/nvfp4moe" \
AB1_POINTS="deepseek-v3:1:w4a4 qwen3-235b:1,4:w4a4 qwen3-30b:1:w4a16,w4a4" AB1_REPEAT=2 POINT_TIMEOUT_S=60 \
DEADLINE_S=330 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
