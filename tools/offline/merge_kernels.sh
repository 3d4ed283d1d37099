#!/usr/bin/env bash
# Air-gapped deployment, on the preparing machine, from the project's root (its venv active): add the
# kernels pack_kernels.sh brought back (its folder, $1; optional) to the store of compiled FlashInfer
# modules ($ATTN_OFFLINE_STORE, default .offline-modules; prebuild_kernels.py builds into it too),
# stripped of their symbols, and pack a selection of the store into $ATTN_OFFLINE_DIR/kernels/ (default
# .offline/kernels) for the next deployment, in parts of at most $PART_MB MB (default 15).
# Which modules: $SELECT, an extended regex over their names, or what
# `python -m tools.offline.prebuild_kernels --carry-mb` picks within $KERNELS_MB (default 40, less
# Triton's cache where one is kept): the modules its plan does not know first (a machine compiled them
# for a reason the plan does not model), then by compile seconds saved per MB. It counts each module
# xz'd alone (0.3-1.3 MB: their GPU code is compressed already); packed together they take about 0.7
# of that.
set -euo pipefail
dir=${ATTN_OFFLINE_DIR:-.offline}
store=${ATTN_OFFLINE_STORE:-.offline-modules}
part_mb=${PART_MB:-15}
mkdir -p "$store" "$dir/kernels"
if [ -n "${1:-}" ] && ls "$1"/flashinfer-modules.tar.xz.* >/dev/null 2>&1; then
  cat "$1"/flashinfer-modules.tar.xz.* | xz -d | tar x -C "$store"
fi
if [ -n "${1:-}" ] && [ -f "$1"/triton-cache.tar.xz ]; then cp "$1"/triton-cache.tar.xz "$dir/kernels/"; fi
if command -v strip >/dev/null; then find "$store" -name '*.so' -exec strip --strip-unneeded {} +; fi
triton_mb=$(( $(stat -c %s "$dir/kernels/triton-cache.tar.xz" 2>/dev/null || echo 0) / 1000000 ))
selection=$(mktemp) && trap 'rm -f "$selection"' EXIT
if [ -n "${SELECT:-}" ]; then (cd "$store" && ls | grep -E "$SELECT") > "$selection"
else python3 -m tools.offline.prebuild_kernels --out "$store" --carry-mb $(( ${KERNELS_MB:-40} - triton_mb )) > "$selection"; fi
kernels=$(cd "$dir/kernels" && pwd) && rm -f "$kernels"/flashinfer-modules.tar.xz.*
(cd "$store" && tar c -T "$selection" | xz -T0 -9 | split -b "${part_mb}M" - "$kernels/flashinfer-modules.tar.xz.")
echo "merge_kernels: $(wc -l < "$selection") of $(ls "$store" | wc -l) modules in $dir/kernels"
du -sh "$store" "$dir/kernels"
