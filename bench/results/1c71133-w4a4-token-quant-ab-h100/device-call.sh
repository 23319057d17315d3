# One call (twenty-ninth session): the GPU tests of w4a4 at T = 2 .. 4 routed and quantized in GEMM1
# (NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1, opt-in until this runs) and of GEMM2 reading GEMM1's T k ids
# (NVFP4MOE_GEMM2_READS_TOKEN_IDS=1, opt-in since the twenty-eighth session): the bitwise tests against the routing
# launch / the gather, PresetDims in both modes with both switches on (T = 1 / 4 / 9 / 300 against the CPU
# reference at the presets' widths), the T = 1 routing tests, graph capture, determinism; memcheck of the new test;
# then the A/B of the same binary: base (the defaults) / quant (GEMM1 quantizes) / ids (and GEMM2 reads the ids).
# Run as SHA=<sha> END_S=520 bash <this script> with the carry packed (scripts/pack_carry.sh).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
L=.carry/cuda_test_cuda_layer
timeout 150 $L --gtest_color=no --gtest_filter='*W4A4TokensQuantizedInGemm1*:*TokensRoutedInGemm1*:*T1W4A4Quantized*:*T1RouteInGemm*:*GraphCapture*:*DeterministicAndPoison*' > $W/$SHA-$G-cuda-layer-subset.log 2>&1
echo "layer rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-cuda-layer-subset.log | tail -10
NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1 NVFP4MOE_GEMM2_READS_TOKEN_IDS=1 timeout 140 $L --gtest_color=no --gtest_filter='Modes/ModeTest.PresetDims/*:Modes/ModeTest.AdversarialRouting/w4a4' > $W/$SHA-$G-presets-switches-on.log 2>&1
echo "presets rc $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]" $W/$SHA-$G-presets-switches-on.log | tail -5
grep -h -B2 -A12 "Failure" $W/*.log | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 80 $SAN --tool memcheck --error-exitcode 3 $L --gtest_color=no --gtest_filter='*W4A4TokensQuantizedInGemm1*' > $W/$SHA-$G-memcheck-token-quant.log 2>&1
echo "memcheck rc $? [$SECONDS s]"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/$SHA-$G-memcheck-token-quant.log | tail -2
B=$(( ${END_S:-520} - SECONDS )); echo "[$SECONDS s] A/B budget $B"
VARIANTS="base:.carry/nvfp4moe quant:.carry/nvfp4moe:NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1 ids:.carry/nvfp4moe:NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1;NVFP4MOE_GEMM2_READS_TOKEN_IDS=1" \
POINTS="qwen3-235b:2,4:w4a16,w4a4 qwen3-30b:2,4:w4a16,w4a4 gpt-oss-120b:4:w4a16,w4a4 deepseek-v3:2:w4a16,w4a4 nemotron-nano:4:w4a4 qwen3-235b:3:w4a4" \
  POINT_TIMEOUT_S=60 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $B bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
echo "[$SECONDS s] done"
(cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT
