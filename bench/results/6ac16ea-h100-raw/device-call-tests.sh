# One call, on the commits that turned on w4a4 T = 2 .. 4 quantized in GEMM1 and GEMM2 reading GEMM1's T k ids:
# the layer tests of both defaults (the bitwise tests with both GEMMs' configs forced, GEMM2's ws8_s4_w16_x2
# token-ids kernel included; the w4a4 model tests against the CPU reference incl. PresetDims at T = 1 / 4 / 9 / 300;
# fused gather, batch invariance, graph capture), memcheck of the w4a16 token test, then the protocol run
# (ceilings, every preset and T, the torch baseline). Run as SHA=<sha> END_S=570 bash <this script>. Written in the
# twenty-ninth session; not run there (six starts refused after the A/B call used the device time).
# If the tests pass: NVFP4MOE_GEMM2_READS_TOKEN_IDS's two-slice exclusion (cuda_layer.cpp) can go.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
L=.carry/cuda_test_cuda_layer
timeout 170 $L --gtest_color=no --gtest_filter='*W4A4TokensQuantizedInGemm1*:*TokensRoutedInGemm1*:*T1W4A4Quantized*:*FusedRoutePlanGather*:*BatchInvariance*:*Sm90BitwiseAcrossRuns*:*GraphCapture*:Modes/ModeTest.*/w4a4' > $W/$SHA-$G-cuda-layer-subset.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-subset.log | tail -14
grep -h -B3 -A12 "Failure" $W/*.log | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $SAN --tool memcheck --error-exitcode 3 $L --gtest_color=no --gtest_filter='*TokensRoutedInGemm1*' > $W/$SHA-$G-memcheck-tokens.log 2>&1
echo "memcheck rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-memcheck-tokens.log | tail -2
# PROTOCOL=0: the tests only (a call that may be taken back mid-way loses less), the protocol in a second call
if [ "${PROTOCOL:-1}" = 0 ]; then (cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT; exit 0; fi
B=$(( ${END_S:-570} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
OUT=$OUT/p BIN=.carry/nvfp4moe NVFP4MOE_GIT_SHA=$SHA TOTAL_BUDGET_S=$B timeout $(( B + 15 )) bash bench/run_device_bench.sh > $OUT/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf rest.tgz v p bench-driver.log && rm -rf v p bench-driver.log); ls $OUT
