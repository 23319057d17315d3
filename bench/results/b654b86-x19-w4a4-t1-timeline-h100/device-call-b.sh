# The second call (same session): the x19 build with two more phases inside GEMM1's row quantization (P12: the
# CTA's two activation scales arrived, P13: this warp's blocks quantized, before the CTA barrier that P11 follows),
# at T = 1 on qwen3-235b and deepseek-v3 and T = 4 on qwen3-235b, w4a4 (w4a16 for the layer times beside them).
# Run as SHA=<sha> bash <this>; logs in $OUT/logs-b.tgz, the X19 lines in $OUT/x19-b.txt.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu-b.txt
for pt in qwen3-235b:1 deepseek-v3:1 qwen3-235b:4 qwen3-30b:1; do
  preset=${pt%%:*} tokens=${pt#*:}
  timeout 100 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens $tokens \
    --mode w4a16,w4a4 > $W/x19b-$preset-t$tokens.log 2>&1
  echo "x19b $preset T=$tokens: exit $? [$SECONDS s]"
done
grep -h "X19" $W/x19b-*.log > $OUT/x19-b.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(3|4|8|9|10|11|12|13) " $W/x19b-*.log
tar czf $OUT/logs-b.tgz -C $W .
