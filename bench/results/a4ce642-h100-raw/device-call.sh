# The protocol run (ceilings, every preset and T, torch baseline) of HEAD in one call.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
B=$(( ${END_S:-570} - SECONDS )); echo "[$SECONDS s] protocol budget $B"
OUT=$OUT/p BIN=.carry/nvfp4moe NVFP4MOE_GIT_SHA=$SHA TOTAL_BUDGET_S=$B timeout $(( B + 20 )) bash bench/run_device_bench.sh > $OUT/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf rest.tgz p bench-driver.log && rm -rf p bench-driver.log); ls $OUT
