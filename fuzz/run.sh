#!/usr/bin/env bash
# Runs the safetensors fuzzer for a bounded time: fuzz/run.sh BINARY SECONDS.
# Seeds a fresh corpus with small valid files (written here) plus any shipped under fuzz/corpus/, and fails
# when the fuzzer fails (a crash, a sanitizer report, a leak, or an uncaught exception).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 FUZZ_BINARY SECONDS" >&2
  exit 2
fi
bin=$1
secs=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$bin" ] || { echo "fuzz/run.sh: $bin is not an executable" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/nvfp4moe-fuzz.XXXXXX")
corpus=$work/corpus
artifacts=$(dirname "$bin")/fuzz-artifacts
mkdir -p "$corpus" "$artifacts"
trap 'rm -rf "$work"' EXIT

# seed NAME HEADER_JSON DATA_HEX: one safetensors file (8-byte little-endian length, header, data bytes).
seed() {
  local name=$1 header=$2 data=$3 n i
  n=${#header}
  {
    for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done
    printf '%s' "$header"
    local k
    for ((k = 0; k < ${#data}; k += 2)); do printf "\\x${data:k:2}"; done
  } >"$corpus/$name"
}
seed empty '{}' ''
seed meta '{"__metadata__":{"format":"pt"}}' ''
seed u8 '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}      ' '0102'
seed f32_bf16 '{"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"s":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}' '0000803f000000408040'
seed zero_size '{"z":{"dtype":"I64","shape":[0,3],"data_offsets":[0,0]},"b":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}' '01'
seed fp8 '{"__metadata__":{"k":"v"},"q":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},"r":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[4,5]},"i":{"dtype":"I32","shape":[1],"data_offsets":[5,9]}}' '00112233445566778899'
if [ -d "$here/corpus" ]; then cp "$here"/corpus/* "$corpus"/ 2>/dev/null || true; fi

echo "fuzz/run.sh: $bin for ${secs}s, $(ls "$corpus" | wc -l) seeds, artifacts in $artifacts"
"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -dict="$here/safetensors.dict" \
  -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus"
echo "fuzz/run.sh: no failures in ${secs}s"
