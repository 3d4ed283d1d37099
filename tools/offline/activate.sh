# Air-gapped deployment, on the GPU machine without network, from the project's root, with the
# folder pack_wheels.sh (and merge_kernels.sh) filled carried beside it:
#   . tools/offline/activate.sh
# Unpacks the site trees once per machine into $ATTN_OFFLINE_PREFIX (default /tmp/attn-dispatch-offline)
# and puts them and this tree on PYTHONPATH (torch is the machine's own). Precompiled kernels, where
# the folder holds them (kernels/, from merge_kernels.sh), go where FlashInfer and Triton look for them:
# FlashInfer's modules as its AOT modules (each loaded once: one that fails to load is removed, so
# FlashInfer compiles it as it would have, and the log says which), Triton's cache into its cache folder.
# FlashInfer compiles what is missing into $FLASHINFER_WORKSPACE_BASE; pack_kernels.sh packs that.
dir=${ATTN_OFFLINE_DIR:-.offline}
prefix=${ATTN_OFFLINE_PREFIX:-/tmp/attn-dispatch-offline}
if [ ! -f "$prefix/.installed" ]; then
  mkdir -p "$prefix/site" "$prefix/flashinfer" && \
    xz -dc "$dir/site.tar.xz" | tar x -C "$prefix/site" && \
    xz -dc "$dir/flashinfer.tar.xz" | tar x -C "$prefix/flashinfer" && \
    [ -d "$prefix/flashinfer/flashinfer" ] && [ -d "$prefix/site/pydantic" ] && \
    touch "$prefix/.installed" || echo "activate: unpacking $dir into $prefix failed" >&2
fi
export PYTHONPATH="$prefix/flashinfer:$prefix/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$prefix/workspace} PYTHONUNBUFFERED=1
aot=$prefix/flashinfer/flashinfer/data/aot
if ls "$dir"/kernels/flashinfer-modules.tar.xz.* >/dev/null 2>&1 && [ ! -f "$aot/.carried" ]; then
  mkdir -p "$aot" && cat "$dir"/kernels/flashinfer-modules.tar.xz.* | xz -d | tar x -C "$aot" && touch "$aot/.carried"
  python3 - "$aot" <<'PY' >&2
import shutil
import sys
from pathlib import Path

import torch  # noqa: F401 - loads the CUDA runtime the modules link against, as FlashInfer finds it loaded
import tvm_ffi

bad = []
for so in sorted(Path(sys.argv[1]).glob("*/*.so")):
    try:
        tvm_ffi.load_module(str(so))
    except Exception as e:  # noqa: BLE001 - any failure: FlashInfer compiles this one itself
        bad.append(f"{so.parent.name}: {str(e)[:120]}")
        shutil.rmtree(so.parent)
print(f"activate: {len(list(Path(sys.argv[1]).glob('*/*.so')))} precompiled FlashInfer modules load; removed {len(bad)}")
print("\n".join(bad))
PY
fi
triton_cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -f "$dir/kernels/triton-cache.tar.xz" ] && [ ! -f "$prefix/.triton-carried" ]; then
  mkdir -p "$triton_cache" && xz -dc "$dir/kernels/triton-cache.tar.xz" | tar x -C "$triton_cache" && \
    touch "$prefix/.triton-carried"
  echo "activate: $(ls "$triton_cache" | wc -l) Triton cache entries" >&2
fi
