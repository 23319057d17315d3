# One call: the GPU tests of "every warp quantizes" (the new test and the T = 1 checks against the CPU, sanitizers),
# the A/B against 6186920's CLI (.carry/base), then the protocol's decode points with the ceilings in the time left.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
ok=1
timeout 120 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1*:*GraphCapture*:Modes/ModeTest.PresetDims/w4a4:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/w4a4' > $W/$SHA-$G-cuda-layer-subset.log 2>&1; r=$?; echo "layer rc $r [$SECONDS s]"; tail -1 $W/$SHA-$G-cuda-layer-subset.log; [ $r = 0 ] || ok=0
grep -B2 -A10 "Failure" $W/*.log | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck racecheck; do
  timeout 60 $SAN --tool $tool --error-exitcode 3 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4*' > $W/$SHA-$G-$tool-t1w4a4.log 2>&1
  echo "$tool rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $W/$SHA-$G-$tool-t1w4a4.log | tail -2
done
echo "[$SECONDS s] tests ok=$ok"
if [ $ok = 1 ]; then
  VARIANTS="piece-warps:.carry/base/nvfp4moe all-warps:.carry/nvfp4moe" \
  POINTS="qwen3-30b:1:w4a4 nemotron-nano:1:w4a4 qwen3-235b:1:w4a4 gpt-oss-120b:1:w4a4 deepseek-v3:1:w4a4" POINT_TIMEOUT_S=30 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab \
    timeout 100 bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
  bin=.carry/nvfp4moe; bsha=$SHA
else
  bin=.carry/base/nvfp4moe; bsha=6186920
fi
echo "tests ok=$ok: benchmark on $bin ($bsha)" | tee $OUT/bench-binary.txt
# The decode points (T <= 64) of the protocol with the ceilings of the same call (no torch: e15fe52's run has it).
mkdir -p $OUT/p; timeout 60 python3 bench/torch_baseline.py --ceilings-only --out $OUT/p/torch_ceilings.json > $W/ceilings.log 2>&1
B=$(( ${END_S:-570} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
OUT=$OUT/p BIN=$bin NVFP4MOE_GIT_SHA=$bsha TOTAL_BUDGET_S=$B TOKENS=1,4,16,64 SKIP_TORCH=1 timeout $(( B + 20 )) bash bench/run_device_bench.sh > $W/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf rest.tgz v p && rm -rf v p); ls $OUT
