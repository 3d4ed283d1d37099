# Source first in a device command that carries .whl, .whl072 and (when there is one) .jit:
#   . tools/gpu_env.sh
# Installs the wheels once per machine (FlashInfer 0.7.2 in /tmp/site072, ahead of .whl's
# cudnn-frontend, pydantic and tvm-ffi in /tmp/site), and the FlashInfer modules compiled on an
# earlier machine (.jit, from tools/jit_pack.sh) as FlashInfer's AOT modules, so they load
# without a compile. Then `python3 -m dispatch ...` runs this tree.
# .whl and .whl072 (FlashInfer 0.7.2 pruned, an xz'd tree since session 18): tools/carry_prep.sh.
if [ ! -f /tmp/site072/.installed ]; then
  pip_install="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
  # .whl072: the pruned wheel, or the pruned wheel's tree as .tar.xz (half the bytes)
  # .whl: the wheels, or (since session 20) their unpacked tree as .tar.xz (10 MB against 17.6)
  mkdir -p /tmp/site072 /tmp/site && \
    { ls .whl/*.whl >/dev/null 2>&1 && $pip_install --target /tmp/site .whl/*.whl || true; } && \
    { ls .whl/*.tar.xz >/dev/null 2>&1 && xz -dc .whl/*.tar.xz | tar x -C /tmp/site || true; } && \
    { ls .whl072/*.whl >/dev/null 2>&1 && $pip_install --target /tmp/site072 .whl072/*.whl || true; } && \
    { ls .whl072/*.tar.xz >/dev/null 2>&1 && xz -dc .whl072/*.tar.xz | tar x -C /tmp/site072 || true; } && \
    [ -d /tmp/site072/flashinfer ] && [ -d /tmp/site/pydantic ] && [ -d /tmp/site/cudnn ] && \
    touch /tmp/site072/.installed || echo "gpu_env: wheel install failed" >&2
fi
export PYTHONPATH=/tmp/site072:/tmp/site:$PWD FLASHINFER_WORKSPACE_BASE=/tmp/fi072 PYTHONUNBUFFERED=1
aot=/tmp/site072/flashinfer/data/aot
if ls .jit/jit-so.tar.xz.* >/dev/null 2>&1 && [ ! -f $aot/.carried ]; then
  mkdir -p $aot && cat .jit/jit-so.tar.xz.* | xz -d | tar x -C $aot && touch $aot/.carried
  echo "gpu_env: $(ls $aot | wc -l) carried FlashInfer modules" >&2
  # load each once (tools/jit_prebuild.py builds some off the GPU): one that fails goes, so FlashInfer
  # compiles it as it would have, and the log says which
  python3 - "$aot" <<'PY' >&2
import sys, shutil
import torch  # noqa: F401 - loads libcudart.so.13, which the modules need, as FlashInfer finds it loaded
import tvm_ffi
from pathlib import Path
bad = []
for so in sorted(Path(sys.argv[1]).glob("*/*.so")):
    try:
        tvm_ffi.load_module(str(so))
    except Exception as e:  # noqa: BLE001 - any failure: not carried
        bad.append(f"{so.parent.name}: {str(e)[:120]}")
        shutil.rmtree(so.parent)
print(f"gpu_env: carried modules that load: {len(list(Path(sys.argv[1]).glob('*/*.so')))}; removed {len(bad)}")
print("\n".join(bad))
PY
fi
# Triton's cache from an earlier machine (tools/jit_pack.sh), where Triton looks for it
if [ -f .jit/triton-cache.tar.xz ] && [ ! -f /tmp/.triton-carried ]; then
  mkdir -p "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" && xz -dc .jit/triton-cache.tar.xz | \
    tar x -C "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" && touch /tmp/.triton-carried
  echo "gpu_env: $(ls "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" | wc -l) Triton cache entries carried" >&2
fi
