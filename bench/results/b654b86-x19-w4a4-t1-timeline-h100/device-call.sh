# One device call (thirty-third session): experiment 19's timeline (bench/experiments/x19-w4a4-t1-timeline-on-b654b86.patch,
# the CLI built from it carried as .carry/x19/nvfp4moe) of the T = 1 decode layer in w4a16 and w4a4, to separate
# what w4a4 T = 1 pays over w4a16 (1.5 / 2.4 / 2.6 us at qwen3-30b / qwen3-235b / deepseek-v3 on an H100): GEMM1's
# phases P8 (routing done), P3 (first weights issued), P9 / P10 (row wait begun / row in), P11 (row quantization
# and its barrier done), P4 (first k-tile in), P5 (k-loop done), P6 (epilogue done), P7 (exit); GEMM2's and the
# combine's. Also qwen3-235b T = 4 (the quantizing token rows). The engine's own CLI (.carry/nvfp4moe) times the same
# points without stamps. Run as SHA=<sha> bash <this>; logs in $OUT/logs.tgz, the X19 lines in $OUT/x19.txt.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
run() {  # run NAME BIN PRESET TOKENS [env...]
  local name=$1 bin=$2 preset=$3 tokens=$4; shift 4
  timeout 100 env "$@" $bin bench --preset $preset --tokens $tokens --mode w4a16,w4a4 > $W/$name-$preset-t$tokens.log 2>&1
  echo "$name $preset T=$tokens: exit $? [$SECONDS s]"; grep -E "us/layer" $W/$name-$preset-t$tokens.log
}
for preset in qwen3-30b qwen3-235b deepseek-v3; do
  run x19 .carry/x19/nvfp4moe $preset 1 NVFP4MOE_X19_REPLAYS=16
  run base .carry/nvfp4moe $preset 1
done
run x19 .carry/x19/nvfp4moe qwen3-235b 4 NVFP4MOE_X19_REPLAYS=16
grep -h "X19" $W/x19-*.log > $OUT/x19.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(1|3|4|5|6|7|8|9|10|11) |ws_gemm2 +#0 P(1|4|5|7) |combine +#0 P(1|7) " $W/x19-*.log
tar czf $OUT/logs.tgz -C $W .
