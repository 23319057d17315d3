# One device call: the protocol of ../shared/docs/benchmarks.md (ceilings, every preset and T, the torch baseline)
# on the carried CLI (PROTOCOL_BIN: another carried CLI), nothing else. Run as SHA=<sha> BUDGET_S=<s> bash
# bench/protocol-call.sh on a carry packed by scripts/pack_carry.sh. The tool returns at most 8 files a call: the
# merged JSON, the summary and the roofline PNG come back as files, everything else (per-preset JSON and logs,
# torch logs, gpu info) in $OUT/raw.tgz.
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
SHA=${SHA:-unknown}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
OUT=$OUT/p BIN=${PROTOCOL_BIN:-.carry/nvfp4moe} NVFP4MOE_GIT_SHA=$SHA TOTAL_BUDGET_S=${BUDGET_S:-450} \
  timeout $(( ${BUDGET_S:-450} + 20 )) bash bench/run_device_bench.sh > $OUT/bench-driver.log 2>&1
echo "protocol rc $? [$SECONDS s]"; tail -3 $OUT/p/summary.txt 2>/dev/null
mv $OUT/p/bench-*.json $OUT/p/summary-*.md $OUT/p/roofline-*.png $OUT/ 2>/dev/null
(cd $OUT && tar czf raw.tgz p bench-driver.log && rm -rf p bench-driver.log); ls -la $OUT
