# One call (twenty-ninth session, the device time short after five refused starts): the layer tests of the
# defaults turned on in 2435096 (w4a4 T = 2 .. 4 quantized in GEMM1, GEMM2 reading GEMM1's T k ids: the bitwise tests
# with both GEMMs' configs forced, the w4a4 model tests against the CPU reference incl. PresetDims at T = 1 / 4 / 9 /
# 300, fused gather, graph capture), then the protocol over the decode points only (ceilings, torch baseline,
# T = 1, 2, 3, 4, 16, 64). Run as SHA=<sha> END_S=370 bash <this script>.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
L=.carry/cuda_test_cuda_layer
timeout 125 $L --gtest_color=no --gtest_filter='Modes/ModeTest.PresetDims/w4a4:*W4A4TokensQuantizedInGemm1*:*TokensRoutedInGemm1*:*FusedRoutePlanGather*:*GraphCapture*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/w4a4' > $W/$SHA-$G-cuda-layer-subset.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-subset.log | tail -12
grep -h -B3 -A12 "Failure" $W/*.log | head -40
B=$(( ${END_S:-370} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
OUT=$OUT/p BIN=.carry/nvfp4moe NVFP4MOE_GIT_SHA=$SHA TOKENS=1,2,3,4,16,64 TOTAL_BUDGET_S=$B timeout $(( B + 10 )) bash bench/run_device_bench.sh > $OUT/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf rest.tgz v p bench-driver.log && rm -rf v p bench-driver.log); ls $OUT
