# One device call for the two pending T = 1 measurements (thirty-seventh session), on a carry packed as
#   VARIANT_BUILDS="x19:<x19 tree>/build v2:<v2 tree>/build" bash scripts/pack_carry.sh build
# where the x19 tree is HEAD + bench/experiments/x19-t1-first-piece-on-44abfde.patch (CLI only) and the v2 tree is
# HEAD + bench/experiments/t1-gemm2-resident-rows-v2-on-e51250f.patch (whole tree: its GPU tests run here).
#   1. x19d (bench/results/x19d-t1-per-scheduler-call.sh's question, its predictions in that file): x19's T = 1
#      stamps, only on an H200 (an H100 repeats bench/results/0b9e747-h100-raw/x19-t1-final-tree.txt).
#   2. the resident rows' second form (bench/experiments/t1-gemm2-resident-rows-v2-call.sh: its predictions,
#      -0.2..0.6 us at qwen3-235b / deepseek-v3 T = 1, -0.2..0.5 at qwen3-30b), one binary with and without
#      NVFP4MOE_T1_GEMM2_RESIDENT=0, then its GPU tests.
#   3. Nsight Compute on today's prefill GEMMs (below).
# Run as SHA=<sha> bash <this> (carry [".carry"]).
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "gpu: $gpu"
if [[ "$gpu" == *H200* ]]; then
  mkdir -p $OUT/x19d && OUT=$OUT/x19d bash bench/results/x19d-t1-per-scheduler-call.sh > $OUT/x19d/driver.log 2>&1
  echo "x19d: exit $? [$SECONDS s]"; rm -rf $OUT/x19d/w; grep -vE "^$" $OUT/x19d/driver.log | tail -40
else
  echo "x19d: skipped (not an H200)"
fi
left=$(( 420 - SECONDS ))
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 90 .carry/v2/cuda_test_sm90_grouped_gemm --gtest_color=no --gtest_filter='*T1Speculative*' > \$W/\$SHA-sm90-gemm-subset.log 2>&1
echo \"gemm exit \$?\"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^\[       OK|^\[  SKIPPED' \$W/\$SHA-sm90-gemm-subset.log
timeout 300 .carry/v2/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1RouteInGemm*:*T1W4A4QuantizedRows*:*GraphCaptureReplay*:Modes/ModeTest.LayerMatchesReferenceOverT/*:Modes/ModeTest.PresetDims/w4a16:Modes/ModeTest.PresetDims/w4a4' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK' \$W/\$SHA-cuda-layer-subset.log" \
AB1_VARIANTS="new:.carry/v2/nvfp4moe off:.carry/v2/nvfp4moe:NVFP4MOE_T1_GEMM2_RESIDENT=0 head:.carry/nvfp4moe" \
AB1_POINTS="deepseek-v3:1:w4a16 qwen3-235b:1:w4a16,w4a4 qwen3-30b:1:w4a16" \
AB1_REPEAT=2 POINT_TIMEOUT_S=60 DEADLINE_S=$left NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
echo "bundle: exit $? [$SECONDS s]"
# 3. Prefill's open question before the SS-wgmma kernel (docs/gemm.md, "Prefill with SS wgmma: a budgeted sketch"):
#    the L2 -> SM traffic and the stalls of today's bt144 GEMMs at deepseek-v3 T = 4096 w4a16 (one eager forward of
#    the HEAD CLI, Nsight Compute's full set plus the raw counters), on whatever card this is.
mkdir -p $OUT/ncu
NCU_CASES="layer:deepseek-v3:4096" NCU_LAYERS=1 CARRY=.carry OUT=$OUT/ncu NVFP4MOE_GIT_SHA=${SHA:-unknown} \
  timeout $(( 585 - SECONDS )) bash scripts/device_ncu_gemm.sh
echo "ncu: exit $? [$SECONDS s]"; cat $OUT/ncu/*-ncu-summary.txt
