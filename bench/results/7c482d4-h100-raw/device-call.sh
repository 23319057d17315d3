# One call: the GPU tests of the two changes, the A/B (1492a45 reading after the wait / guessing; 3aa68db both
# changes), then the protocol on the tested binary (or the fallback: 5768993's machine code at T = 1) in the time left.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
ok=1
timeout 30 .carry/cuda_test_decode_route_kernels --gtest_color=no > $W/$SHA-$G-decode-route.log 2>&1; r=$?; echo "route rc $r"; tail -1 $W/$SHA-$G-decode-route.log; [ $r = 0 ] || ok=0
timeout 60 .carry/cuda_test_sm90_grouped_gemm --gtest_color=no > $W/$SHA-$G-sm90-gemm.log 2>&1; r=$?; echo "gemm rc $r"; tail -1 $W/$SHA-$G-sm90-gemm.log; [ $r = 0 ] || ok=0
grep -E "T1Speculative" $W/$SHA-$G-sm90-gemm.log | tail -1
timeout 120 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1*:*GraphCapture*:*PresetDims*:*Adversarial*:*FusedRoutePlanGather*' > $W/$SHA-$G-cuda-layer-subset.log 2>&1; r=$?; echo "layer rc $r"; tail -1 $W/$SHA-$G-cuda-layer-subset.log; [ $r = 0 ] || ok=0
grep -B2 -A8 "Failure" $W/*.log | head -30
echo "[$SECONDS s] tests ok=$ok"
if [ $ok = 1 ]; then
  VARIANTS="wait:.carry/base/nvfp4moe:NVFP4MOE_T1_GEMM2_GUESSES_IDS=0 guess:.carry/base/nvfp4moe skip:.carry/nvfp4moe" \
  POINTS="qwen3-30b:1:w4a16 qwen3-235b:1:w4a16 deepseek-v3:1:w4a16 gpt-oss-120b:1:w4a16 nemotron-nano:1:w4a16 qwen3-30b:4:w4a16" POINT_TIMEOUT_S=30 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab \
    timeout 110 bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
  bin=.carry/nvfp4moe; bsha=$SHA
else
  bin=.carry/fallback-nvfp4moe; bsha=5768993
fi
echo "suites ok=$ok: benchmark on $bin ($bsha)" | tee $OUT/bench-binary.txt
B=$(( ${END_S:-565} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
OUT=$OUT/p BIN=$bin NVFP4MOE_GIT_SHA=$bsha TOTAL_BUDGET_S=$B timeout $(( B + 25 )) bash bench/run_device_bench.sh > $W/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf rest.tgz v p && rm -rf v p); ls $OUT
