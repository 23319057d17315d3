# T = 1 A/B of GEMM2's rows resident in shared memory (3f80c6d, Sm90GemmArgs::direct_rows_resident), one binary:
#   new = 3f80c6d's CLI (GEMM2 at T = 1 copies its k (+ 1) rows once after its PDL wait, one bulk copy a row on its
#         own mbarrier, and runs the broadcast kernels' k-loop: no token copies in the ring);
#   off = the same CLI with NVFP4MOE_T1_GEMM2_RESIDENT=0 (the token tile copied k-tile by k-tile, as before);
#   x25 = ebf653c's experiment 25 build (`-DNVFP4MOE_SM90_EXPERIMENT=25`): new with the resident GEMM2's ring 10
#         k-tiles deep, so 9 k-tiles of each warp's weights go out before its PDL wait instead of 5. Predicted: a
#         further -0.3..1.0 us at qwen3-235b and deepseek-v3 T = 1 (GEMM2's CTAs start as GEMM1's leave, 0.6-2 us
#         before the wait, while the HBM serves only GEMM1's last warps), ~0 at qwen3-30b (12 k-tiles a piece).
# Predicted before the run (docs/gemm.md, "GEMM2's rows resident at T = 1"): the k-loop ~40 SASS a k-tile shorter
# (as the broadcast-row GEMM1 measured: qwen3-30b T = 1 -1.1 us there) and its first k-tile waiting only for its
# own weights' group and its row, against a burst of k (+ 1) rows x 2 I bytes per CTA from L2 (deepseek-v3 36 KB a
# CTA, 4.75 MB in all) after the wait: qwen3-235b T = 1 -0.3..1.0 us (GEMM2's k-loop at 2.7 TB/s with ~2 warps a
# scheduler), qwen3-30b -0.3..0.8 (lone warps: bound by their instruction chain), deepseek-v3 -0..0.8 (3.8 warps a
# scheduler: HBM-bound on the H100); w4a4 not timed in this call (the same GEMM2; its tests run).
# Then the GPU tests of the change: the GEMM suite's speculative-ids test (every case with and without the resident
# rows, bitwise, stale guesses rerun), the layer's T1RouteInGemm (the switch added), the w4a4 T = 1 quantized-rows
# test and LayerMatchesReferenceOverT in both modes (the default path now takes the resident rows; PresetDims left
# for the next call: the call's time). Then x19's stamps (bench/experiments/x19e-t1-gemm2-resident-on-3f80c6d.patch:
# the x19 patch plus P9 / P10 / P11 in GEMM2's resident row_ready: copies issued, guess checked, the piece's row in)
# at deepseek-v3 and qwen3-235b T = 1 w4a16, with and without the resident rows: GEMM2's P1 (wait) -> P4 (first
# k-tile) and P4 -> P5 (k-loop) predicted shorter with them.
#   SHA=3f80c6d bash <this>   (carry [".carry"], packed from 3f80c6d's build with VARIANT_BUILDS="x19:<x19e build>
#   x25:<ebf653c built with -DNVFP4MOE_SM90_EXPERIMENT=25>")
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 90 .carry/cuda_test_sm90_grouped_gemm --gtest_color=no --gtest_filter='*T1Speculative*' > \$W/\$SHA-sm90-gemm-subset.log 2>&1
echo \"gemm exit \$?\"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^\[       OK|^\[  SKIPPED' \$W/\$SHA-sm90-gemm-subset.log
timeout 150 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1RouteInGemm*:*T1W4A4QuantizedRows*:Modes/ModeTest.LayerMatchesReferenceOverT/*' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK' \$W/\$SHA-cuda-layer-subset.log
for preset in qwen3-235b deepseek-v3; do for r in 1 0; do
  timeout 50 env NVFP4MOE_X19_REPLAYS=12 NVFP4MOE_T1_GEMM2_RESIDENT=\$r .carry/x19/nvfp4moe bench --preset \$preset --tokens 1 --mode w4a16 > \$W/x19e-\$preset-resident\$r.log 2>&1
  echo \"x19e \$preset resident=\$r exit \$?\"; grep -E 'X19 (qwen|deep)|ws_gemm1 +#0 P(5|7) |ws_gemm2 +#0 P(0|1|4|5|7|9|10|11) |combine +#0 P7' \$W/x19e-\$preset-resident\$r.log
done; done" \
AB1_VARIANTS="new:.carry/nvfp4moe off:.carry/nvfp4moe:NVFP4MOE_T1_GEMM2_RESIDENT=0 x25:.carry/x25/nvfp4moe" \
AB1_POINTS="deepseek-v3:1:w4a16 qwen3-235b:1:w4a16 qwen3-30b:1:w4a16" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=560 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
