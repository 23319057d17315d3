# Pending call (thirty-sixth session: built and committed as 2377b5d, never run: the session's device time went to
# refused starts; then reverted with the rest of the resident-rows code). To run it: a worktree of the engine at
# e51250f or later with bench/experiments/t1-gemm2-resident-rows-v2-on-e51250f.patch applied (its kernels, tests and
# host refusals), `cmake --build build` (the whole tree: the call runs its GPU tests), scripts/pack_carry.sh build,
# then SHA=<that tree's sha> bash <this> (carry [".carry"]).
# T = 1 A/B of GEMM2's resident rows, second form (2377b5d), one binary:
#   new = 2377b5d's CLI: GEMM2 at T = 1 keeps its k (+ 1) rows in shared memory, all on the one row barrier (claimed
#         and issued by the first warp of a CTA after its wait), the guess's ids loaded right after the wait and
#         compared only after the piece's k-loop (before its stores);
#   off = the same CLI with NVFP4MOE_T1_GEMM2_RESIDENT=0 (the token tile copied k-tile by k-tile).
# Predicted before the run, from 3f80c6d's stamps (bench/results/3f80c6d-t1-gemm2-resident-ab-h100: its k-loop
# 0.42-0.55 us shorter, its first k-tile 0.7-1.0 us later, ~0.4 of it the setup's per-row barriers and ~0.6 the
# guess's check in series with the rows): the first k-tile about as early as off's, so qwen3-235b / deepseek-v3
# T = 1 -0.2..0.6 us, qwen3-30b -0.2..0.5; if the setup was not the cause of the later pieces, about even.
# Then the GPU tests of the change: the GEMM suite's speculative-ids test (with and without the resident rows,
# stale guesses caught only after the k-loop now), the layer's T = 1 tests, LayerMatchesReferenceOverT in four
# modes and PresetDims in both modes (real preset shapes against the CPU reference, T = 1 included).
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 90 .carry/cuda_test_sm90_grouped_gemm --gtest_color=no --gtest_filter='*T1Speculative*' > \$W/\$SHA-sm90-gemm-subset.log 2>&1
echo \"gemm exit \$?\"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^\[       OK|^\[  SKIPPED' \$W/\$SHA-sm90-gemm-subset.log
timeout 300 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1RouteInGemm*:*T1W4A4QuantizedRows*:*GraphCaptureReplay*:Modes/ModeTest.LayerMatchesReferenceOverT/*:Modes/ModeTest.PresetDims/w4a16:Modes/ModeTest.PresetDims/w4a4' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK' \$W/\$SHA-cuda-layer-subset.log" \
AB1_VARIANTS="new:.carry/nvfp4moe off:.carry/nvfp4moe:NVFP4MOE_T1_GEMM2_RESIDENT=0" \
AB1_POINTS="deepseek-v3:1:w4a16 qwen3-235b:1:w4a16,w4a4 qwen3-30b:1:w4a16" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=560 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
