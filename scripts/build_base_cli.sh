#!/usr/bin/env bash
# Builds the CLI of an earlier commit for an A/B against the working tree (the base of scripts/pack_carry.sh's
# BASE_CLI): a detached git worktree of <sha> at /tmp/nvfp4moe-base-<sha> (or DIR), configured Release like
# build/, only the nvfp4moe_cli target (the library and the CLI: ~5-8 minutes on 2 cores from nothing). Prints the
# binary's path last, e.g.
#   BASE_CLI=$(bash scripts/build_base_cli.sh 06df428 | tail -1) VARIANT_BUILDS="x17:build-x17" \
#     bash scripts/pack_carry.sh build
set -euo pipefail
sha=${1:?usage: build_base_cli.sh <sha> [dir]}
full=$(git rev-parse --verify "$sha^{commit}")
dir=${2:-/tmp/nvfp4moe-base-${sha}}
if [ ! -d "$dir/.git" ] && [ ! -f "$dir/.git" ]; then
  git worktree add --detach "$dir" "$full" >&2
fi
[ "$(git -C "$dir" rev-parse HEAD)" = "$full" ] || { echo "build_base_cli.sh: $dir holds $(git -C "$dir" rev-parse --short HEAD), not $sha" >&2; exit 2; }
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release > "$dir/cmake-configure.log" 2>&1 \
  || { echo "build_base_cli.sh: configure failed, see $dir/cmake-configure.log" >&2; exit 1; }
cmake --build "$dir/build" --target nvfp4moe_cli -j"$(nproc)" > "$dir/cmake-build.log" 2>&1 \
  || { echo "build_base_cli.sh: build failed, see $dir/cmake-build.log" >&2; exit 1; }
echo "$dir/build/nvfp4moe"
