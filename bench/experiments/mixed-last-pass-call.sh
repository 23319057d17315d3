# One device call (forty-second session's build): the mixed last prefill pass (Sm90GemmArgs::mixed_last_pass,
# opt-in NVFP4MOE_SM90_MIXED_LAST_PASS=1; docs/gemm.md "The mixed last pass", prediction there). First its GPU
# tests (the GEMM suite's MixedLastPassBitIdenticalToPlain, the layer's MixedLastPassBitIdenticalToPlain), then
# gemm_microbench's prefill_rows cases without and with it (every expert at R rows: the narrow last pass priced, and
# what the mixed tile saves of it), then, if the tests passed, the layer A/B at deepseek-v3 prefill (the default
# against the switch, the same binary, 2 repeats). Carry: bash scripts/pack_carry.sh build (gemm_microbench built).
# Run as SHA=<sha> END_S=570 bash <this> (carry [".carry"]; needs_h200: deepseek-v3's T = 16384 stack); on an H100:
# AB_POINTS="deepseek-v3:4096:w4a16,w4a4" (T = 16384 does not fit).
set -u
source scripts/device_call_setup.sh  # the carry unpacked, W, left()
timeout 120 .carry/cuda_test_sm90_grouped_gemm --gtest_filter='*MixedLastPass*:*EveryConfigEveryEpilogue*' \
  > $W/gemm-mixed.log 2>&1; rc1=$?
echo "GEMM tests: exit $rc1 [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/gemm-mixed.log
# (only after the GEMM test passed: a mixed kernel that hung there would hang here too)
rc2=1
if [ $rc1 = 0 ]; then
  timeout 150 .carry/cuda_test_cuda_layer --gtest_filter='*MixedLastPass*:*DynamicTileSchedule*' > $W/layer-mixed.log 2>&1
  rc2=$?
  echo "layer tests: exit $rc2 [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-mixed.log
fi
for v in plain $([ $rc1 = 0 ] && echo mixed); do
  env $([ $v = mixed ] && echo GEMM_MICROBENCH_MIXED=1) GEMM_MICROBENCH_ONLY=prefill_rows timeout 90 \
    .carry/gemm_microbench $W/prefill-rows-$v.jsonl > $W/prefill-rows-$v.txt 2>&1
  echo "prefill_rows $v: exit $? [$SECONDS s]"; grep -E "ceilings|prefill_rows" $W/prefill-rows-$v.txt
done
if [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $(left) -gt 120 ]; then
  VARIANTS="base:.carry/nvfp4moe mixed:.carry/nvfp4moe:NVFP4MOE_SM90_MIXED_LAST_PASS=1" \
    POINTS="${AB_POINTS:-deepseek-v3:4096,16384:w4a16,w4a4}" REPEAT=2 NVFP4MOE_GIT_SHA=${SHA:-unknown} \
    OUT=$W/ab POINT_TIMEOUT_S=200 timeout $(( $(left) - 15 )) bash scripts/device_variant_ab.sh | tee $W/ab.txt
fi
# qwen3-235b T = 4096 (256 +- 16 rows: the heuristic's bt144 runs 144 + 112; on bt128 the experts of 257..288 rows end
# with a narrow third tile, which the mixed pass takes): the default, the switch, and the switch with bt128 forced
if [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $(left) -gt 90 ]; then
  VARIANTS="base:.carry/nvfp4moe mixed:.carry/nvfp4moe:NVFP4MOE_SM90_MIXED_LAST_PASS=1 mixed128:.carry/nvfp4moe:NVFP4MOE_SM90_MIXED_LAST_PASS=1;NVFP4MOE_SM90_CONFIG=bt128_s8_wg2" \
    POINTS="qwen3-235b:4096:w4a16" REPEAT=1 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$W/ab-q235 \
    timeout $(( $(left) - 10 )) bash scripts/device_variant_ab.sh | tee $W/ab-q235.txt
fi
tar czf $OUT/r.tgz -C $W . && rm -rf $W
echo "done [$SECONDS s]"
