#!/usr/bin/env bash
# Air-gapped deployment: the kernels a GPU machine compiled, packed to carry back to the preparing
# machine (where merge_kernels.sh keeps them for the next deployment). Run on the GPU machine after a
# workload, with the environment activate.sh set:
#   tools/offline/pack_kernels.sh [DIR]      # DIR: default $OUT, else ./kernels-out
# FlashInfer's JIT modules (under $FLASHINFER_WORKSPACE_BASE) as flashinfer-modules.tar.xz.aa, .ab, ...
# and Triton's cache as triton-cache.tar.xz, in parts of at most $PART_MB MB (default 15), for
# transports that cap a file's size (Triton's cache only when it fits one part; its size goes to
# the log either way).
set -euo pipefail
out=${1:-${OUT:-kernels-out}}
part_mb=${PART_MB:-15}
mkdir -p "$out"
stage=$(mktemp -d) && trap 'rm -rf "$stage"' EXIT
workspace=${FLASHINFER_WORKSPACE_BASE:-${ATTN_OFFLINE_PREFIX:-/tmp/attn-dispatch-offline}/workspace}
find "$workspace" -name '*.so' -path '*cached_ops*' | while read -r so; do
  name=$(basename "$so" .so); mkdir -p "$stage/$name" && { ln "$so" "$stage/$name/" 2>/dev/null || cp "$so" "$stage/$name/"; }
done
(cd "$stage" && tar c . | xz -T0 -6 | split -b "${part_mb}M" - "$out/flashinfer-modules.tar.xz.")
echo "pack_kernels: $(ls "$stage" | wc -l) FlashInfer modules" >&2
triton_cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -d "$triton_cache" ]; then
  (cd "$triton_cache" && tar c . | xz -T0 -6) > "$stage.triton.tar.xz"
  bytes=$(stat -c %s "$stage.triton.tar.xz")
  echo "pack_kernels: Triton cache $(ls "$triton_cache" | wc -l) entries, $bytes bytes packed" >&2
  if [ "$bytes" -lt $((part_mb * 1000000)) ]; then cp "$stage.triton.tar.xz" "$out/triton-cache.tar.xz"; fi
  rm -f "$stage.triton.tar.xz"
fi
ls -la "$out" >&2
