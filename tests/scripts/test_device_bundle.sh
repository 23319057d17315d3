#!/usr/bin/env bash
# CPU test of the device-call scripts (scripts/device_bundle.sh, device_gpu_suite.sh, device_variant_ab.sh) on
# stand-in binaries: a device call has a hard 600 s limit and the logs come back only if they are packed before
# it, so the deadline logic must hold without a GPU. Two calls in a scratch copy of the scripts:
#   1. everything fits: the suites pass, the A/B runs its points, EXTRA runs, the logs are packed;
#   2. a step outlives the deadline (a stand-in compute-sanitizer that hangs): it is cut with exit 124, the steps
#      after it are skipped and say so, and the call still ends inside DEADLINE_S with its logs packed;
#   3. the suite script alone with SANITIZE_GROUPS: the groups named, in their order, and an unknown one refused.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
mkdir -p "$TMP/scripts" "$TMP/.carry" "$TMP/bin" "$TMP/tests/data"
cp "$ROOT/scripts/device_bundle.sh" "$ROOT/scripts/device_gpu_suite.sh" "$ROOT/scripts/device_variant_ab.sh" "$TMP/scripts/"
cat > "$TMP/.carry/stand_in_test" <<'EOT'
#!/usr/bin/env bash
sleep 0.2; echo "[==========] 3 tests from 1 test suite ran. (200 ms total)"; echo "[  PASSED  ] 3 tests."
EOT
for t in cuda_test_cuda_layer cuda_test_decode_route_kernels cuda_test_sm90_grouped_gemm cuda_test_cuda_stress; do
  cp "$TMP/.carry/stand_in_test" "$TMP/.carry/$t"
done
printf '#!/usr/bin/env bash\nsleep 0.5\necho "qwen3-30b w4a16 uniform T=1 L=8 22.9 us/layer"\n' > "$TMP/.carry/nvfp4moe"
printf '#!/usr/bin/env bash\necho "name, driver_version"\necho "stand-in GPU, 0"\n' > "$TMP/bin/nvidia-smi"
printf '#!/usr/bin/env bash\nsleep "${STAND_IN_SANITIZER_S:-0.2}"\necho "ERROR SUMMARY: 0 errors"\n' > "$TMP/bin/compute-sanitizer"
chmod +x "$TMP"/.carry/* "$TMP"/bin/*
cd "$TMP"
export PATH=$TMP/bin:$PATH

# 1. Everything fits.
t0=$SECONDS
DEADLINE_S=120 SUITE_STEPS="layer gemm stress sanitizer" AB1_VARIANTS="a:.carry/nvfp4moe b:.carry/nvfp4moe" \
  AB1_POINTS="qwen3-30b:1:w4a16" AB1_REPEAT=2 EXTRA='echo "extra W=$W SHA=$SHA"' NVFP4MOE_GIT_SHA=t1 OUT=$TMP/out1 \
  bash scripts/device_bundle.sh > "$TMP/run1.log" 2>&1
rc=$?
check "1: exit 0 (got $rc)" test "$rc" = 0
check "1: the suites' summary came back" grep -q "cuda-layer: exit 0" out1/t1-summary.log
check "1: every sanitizer run ran" test "$(grep -c 'sanitizer .*: exit 0' out1/t1-summary.log)" = 17
check "1: four A/B points measured" test "$(grep -c 'us/layer' out1/t1-points.txt)" = 4
check "1: EXTRA ran with W and SHA" grep -q "extra: exit 0" out1/t1-points.txt
check "1: the logs packed (work/ removed)" test -f out1/t1-logs.tgz -a ! -d out1/work
check "1: EXTRA's output in the archive" bash -c "tar xzOf out1/t1-logs.tgz work/extra.log | grep -q 'extra W=out1/work\\|extra W=$TMP/out1/work'"

# 2. The first sanitizer run hangs: cut at the suites' budget, the rest skipped, the call inside its deadline.
t0=$SECONDS
STAND_IN_SANITIZER_S=300 DEADLINE_S=48 SUITE_STEPS="layer gemm stress sanitizer" \
  AB1_VARIANTS="a:.carry/nvfp4moe" AB1_POINTS="qwen3-30b:1:w4a16" EXTRA='echo late' NVFP4MOE_GIT_SHA=t2 \
  OUT=$TMP/out2 bash scripts/device_bundle.sh > "$TMP/run2.log" 2>&1
rc=$? took=$(( SECONDS - t0 ))
check "2: a failed status (got $rc)" test "$rc" != 0
check "2: ended inside the deadline (${took}s of 48)" test "$took" -le 48
check "2: the hung sanitizer run was cut" grep -q "sanitizer memcheck (warp-streaming gathered A): exit 124" out2/t2-summary.log
check "2: the later sanitizer runs say they were skipped" grep -q "sanitizer racecheck: skipped (budget" out2/t2-summary.log
check "2: the A/B and EXTRA say they were skipped" bash -c "grep -q 'ab1: skipped (deadline' out2/t2-points.txt && grep -q 'extra: skipped (deadline' out2/t2-points.txt"
check "2: the logs packed" test -f out2/t2-logs.tgz -a ! -d out2/work

# 3. SANITIZE_GROUPS picks the sanitizer groups and their order; an unknown group fails the call, by name.
SANITIZE_GROUPS="layer gathered nosuch" STEPS=sanitizer NVFP4MOE_GIT_SHA=t3 OUT=$TMP/out3 \
  bash scripts/device_gpu_suite.sh > "$TMP/run3.log" 2>&1
rc=$?
check "3: a failed status for the unknown group (got $rc)" test "$rc" != 0
check "3: seven sanitizer runs" test "$(grep -c 'sanitizer .*: exit 0' out3/t3-summary.log)" = 7
check "3: the layer group first" bash -c "grep 'sanitizer ' out3/t3-summary.log | head -1 | grep -q 'sanitizer memcheck: exit 0'"
check "3: the unknown group named" grep -q "unknown group 'nosuch'" out3/t3-summary.log
check "3: no dynamic-schedule run" bash -c "! grep -q 'dynamic tile schedule' out3/t3-summary.log"
if [ "$fail" != 0 ]; then
  echo "--- run1.log"; cat "$TMP/run1.log"; echo "--- run2.log"; cat "$TMP/run2.log"
  echo "--- summaries"; cat out1/t1-summary.log out2/t2-summary.log out3/t3-summary.log 2>/dev/null
fi
exit "$fail"
