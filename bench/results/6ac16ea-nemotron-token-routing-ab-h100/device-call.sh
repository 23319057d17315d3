# One call (written in the twenty-ninth session, not run yet): why nemotron-nano at T = 2 .. 4 gains nothing from
# GEMM1 routing its tokens in w4a16 and loses 5.2 us with it in w4a4 (bench/results/1c71133-w4a4-token-quant-ab-h100),
# where every other preset gains 3..6 us. Same binary, variants:
#   launch       the routing launch with its gather (NVFP4MOE_GEMM1_ROUTES_TOKENS=0), both modes
#   gemm1        GEMM1 routing (w4a16: the default; w4a4 forced with NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1)
#   launch-late  / gemm1-late: the same with GEMM2's prologue after its PDL wait (NVFP4MOE_EARLY_GEMM2=0): if the
#                loss is GEMM2's early start (which a GEMM1-written plan takes from GEMM2, and the ids only partly
#                give back), the two late variants come out equal
#   gemm1-seek   GEMM1 routing, GEMM2 seeking the offsets (NVFP4MOE_GEMM2_READS_TOKEN_IDS=0)
# qwen3-30b T = 4 (no separate shared expert, a gain of 6 us) is the control. Run as SHA=<sha> END_S=300 bash <this>.
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
SHA=${SHA:-unknown}; W=$OUT/v; mkdir -p $W/ab
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
Q=NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1
VARIANTS="launch:.carry/nvfp4moe:NVFP4MOE_GEMM1_ROUTES_TOKENS=0 gemm1:.carry/nvfp4moe:$Q \
launch-late:.carry/nvfp4moe:NVFP4MOE_GEMM1_ROUTES_TOKENS=0;NVFP4MOE_EARLY_GEMM2=0 \
gemm1-late:.carry/nvfp4moe:$Q;NVFP4MOE_EARLY_GEMM2=0 gemm1-seek:.carry/nvfp4moe:$Q;NVFP4MOE_GEMM2_READS_TOKEN_IDS=0" \
POINTS="nemotron-nano:2,3,4:w4a16,w4a4 qwen3-30b:4:w4a16,w4a4" \
  POINT_TIMEOUT_S=60 REPEAT=2 NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $(( ${END_S:-300} - SECONDS )) bash scripts/device_variant_ab.sh 2>&1 | grep -v "^ab "
echo "[$SECONDS s] done"
(cd $OUT && tar czf rest.tgz v && rm -rf v); ls $OUT
