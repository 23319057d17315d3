# One device call (thirty-fourth session): (1) the layer tests the 744bfc6 suite run left (cut by its time limit:
# PresetDims/w4a4_mma_sync, AdversarialRouting in all four modes) and the quantizing-GEMM1 tests with the new
# every-warp-busy case on the final kernels (744bfc6's), (2) experiment 19's timeline on HEAD (x24's quantization by
# the idle warps; bench/experiments/x19-w4a4-t1-timeline-on-44abfde.patch, the CLI carried as .carry/x19/nvfp4moe)
# at T = 1, w4a16 and w4a4: where w4a4 T = 1 still loses ~1 us to w4a16 (P8 routing done, P2 piece start, P3 first
# weights issued, P10 row in, P11 quantized rows' barrier passed, P12 / P13 the quantizing warps' scales in / blocks
# done, P4 first k-tile in, P5 k-loop done, P7 exit). Run as SHA=<sha> bash <this>.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry NVFP4MOE_TEST_DATA=$PWD/tests/data
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
timeout 200 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.PresetDims/w4a4_mma_sync:Modes/ModeTest.AdversarialRouting/*' > $W/$SHA-cuda-layer-rest.log 2>&1
echo "layer exit $? [$SECONDS s]"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED' $W/$SHA-cuda-layer-rest.log
for pt in qwen3-235b:1 deepseek-v3:1 qwen3-30b:1; do
  preset=${pt%%:*} tokens=${pt#*:}
  timeout 100 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens $tokens \
    --mode w4a16,w4a4 > $W/x19-$preset-t$tokens.log 2>&1
  echo "x19 $preset T=$tokens: exit $? [$SECONDS s]"
  timeout 60 .carry/nvfp4moe bench --preset $preset --tokens $tokens --mode w4a16,w4a4 > $W/base-$preset-t$tokens.log 2>&1
  grep -E "us/layer" $W/base-$preset-t$tokens.log
done
grep -h "X19" $W/x19-*.log > $OUT/x19.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(2|3|4|5|7|8|10|11|12|13) |ws_gemm2 +#0 P(1|4|5|7) |combine +#0 P(1|7) " $W/x19-*.log
tar czf $OUT/logs.tgz -C $W .
