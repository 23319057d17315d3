# The SS kernel's first device call (thirty-eighth session; docs/gemm.md, "The SS kernel, built"): its GPU tests, then
# the GEMM alone and the whole layer against the register-A prefill tile. Carry: scripts/pack_carry.sh with
# BASE_CLI = 3b747e5's CLI (the epilogue's factoring rescheduled 10 of the 100 register-A kernels' SASS, same
# instruction counts: base vs new at the default configs says whether that moved anything) and gemm_microbench.
# Run as SHA=<sha> PART=tests bash <this>, then PART=ab on the same machine (carry [".carry"] both times), or
# PART=all (AB_VARIANTS / AB_POINTS / END_S to fit one call); on an H100 deepseek-v3 runs 7 layers a replay.
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
SHA=${SHA:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
SS="NVFP4MOE_SM90_CONFIG=gemm1=bt288_s4_ss,gemm2=bt288_s4_ss"
if [ "${PART:-tests}" != ab ]; then
# 1. The SS bitwise test first (a hang or a wrong bit stops here), then the whole GEMM suite.
timeout 60 .carry/cuda_test_sm90_grouped_gemm --gtest_filter='*SsBitIdentical*' > $W/gemm-ss.log 2>&1
echo "gemm SS test: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |Failure|differ" $W/gemm-ss.log | head -8
timeout 200 .carry/cuda_test_sm90_grouped_gemm --gtest_filter='-*SsBitIdentical*' > $W/gemm-all.log 2>&1
echo "gemm suite: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|UNSTABLE" $W/gemm-all.log | head -12
# 2. The layer against the CPU reference with both GEMMs on the SS kernel (every T of the test, both modes).
timeout 90 env $SS .carry/cuda_test_cuda_layer --gtest_filter='*LayerMatchesReferenceOverT*:*PresetDims*' \
  > $W/layer-ss.log 2>&1
echo "layer with SS: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-ss.log | head -8
# 3. The GEMM alone at deepseek-v3 T = 4096 (uniform random routing): bt128, bt144, bt288_s4_ss, bt288_s4_ss3.
GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout 90 .carry/gemm_microbench $W/mb.jsonl > $W/mb.log 2>&1
echo "microbench: exit $? [$SECONDS s]"; cat $W/mb.log
# 3b. Nsight Compute, full set, one launch each of the two GEMM1 kernels above (bt144 SwiGLU, SS SwiGLU with 2
# slots): tensor pipe, shared-memory and L2 throughput, stalls.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in "bt144:kernel<144, 2, 8, .*Epilogue.1, 1, false, false>" "ss:ss_grouped_gemm_kernel<4, 2, .*Epilogue.1>"; do
  name=${k%%:*} re=${k#*:}
  GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout 150 $NCU --clock-control none --kernel-name-base demangled \
    --kernel-name "regex:$re" --launch-skip 2 --launch-count 1 --set full --import-source no -f -o $W/ncu-$name \
    .carry/gemm_microbench $W/mb-ncu.jsonl > $W/ncu-$name.run.log 2>&1
  echo "ncu $name: exit $? [$SECONDS s]"
  $NCU -i $W/ncu-$name.ncu-rep --page details > $W/ncu-$name-details.txt 2>&1
  $NCU -i $W/ncu-$name.ncu-rep --page raw --csv > $W/ncu-$name-raw.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Shared|L1/TEX Hit|Mem Busy|Max Bandwidth|Issue Slots Busy|Executed Ipc A" \
    $W/ncu-$name-details.txt | head -24
done
fi
if [ "${PART:-tests}" != tests ]; then
# 4. The layer: base (3b747e5), new at its defaults, new with SS on both GEMMs, alternating, two repeats.
left=$(( ${END_S:-560} - SECONDS )); echo "ab budget ${left}s"
VARIANTS=${AB_VARIANTS:-"base:.carry/base/nvfp4moe new:.carry/nvfp4moe ss:.carry/nvfp4moe:$SS ss3:.carry/nvfp4moe:${SS//_ss/_ss3}"} \
POINTS=${AB_POINTS:-"deepseek-v3:4096:w4a16 qwen3-235b:4096:w4a16 deepseek-v3:16384:w4a16"} REPEAT=2 \
  NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $left bash scripts/device_variant_ab.sh | tee $W/ab.txt
fi
echo "done [$SECONDS s]"
tar czf $OUT/logs-${PART:-tests}.tgz -C $W . && cp $W/ab.txt $W/mb.log $W/gpu.txt $OUT/ 2>/dev/null
