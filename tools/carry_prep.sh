# Here, on a fresh checkout: the wheels a device call carries (tools/gpu_env.sh installs them there).
#   .whl     fetch-wheels.sh's set without FlashInfer 0.5.3 (cudnn-frontend, pydantic, tvm-ffi), unpacked
#            into one xz'd tree (since session 20): 10 MB, against 17.6 as wheels
#   .whl072  FlashInfer 0.7.2, pruned to what attention builds on sm_90, as an xz'd tree: 13 MB
# data/csrc's sources of kernels attention never builds go (258 -> 7 MB); data/cutlass, cccl and include
# stay (fa3 needs cutlass/tools: sweep A lacked it, NOTES-h200-sweeps.md). Then tools/jit_merge.sh adds
# the modules a machine compiled (.jit). Prints the carry's size against its 64 MiB.
# tools/results (82 MB, tracked) must not travel: move it out of the checkout for the device calls
# (mv tools/results ../results-aside; back before tests or commits). Not as a symbolic link: with one
# left in its place the device tool refused the tree as over 64 MiB (session 19).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .git/info && touch .git/info/exclude
for d in /.whl/ /.whl072/ /.jit/ /.jit-so/; do grep -qx "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
bash ../shared/device/fetch-wheels.sh >/dev/null && rm -f .whl/flashinfer_python-0.5.3-*.whl
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
mkdir "$work/site" && for w in .whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done  # what pip --target puts
(cd "$work/site" && tar c . | xz -T0 -9) > .whl/site-wheels.tar.xz && rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$work" flashinfer-python==0.7.2 2>&1 | grep -v WARN || true
(cd "$work" && unzip -q flashinfer_python-0.7.2-*.whl -d tree)  # unzip keeps the files' modes
(cd "$work/tree/flashinfer/data/csrc" && rm -rf cake_* kda fused_moe gdn experimental blackwell_* alphamoe* \
  cute_sm12x_gemm sparse_mla_sm120 gated_act_mxfp8 trtllm_fused_moe* fmha_v2)
mkdir -p .whl072 && rm -f .whl072/*
(cd "$work/tree" && tar c flashinfer flashinfer_python-0.7.2.dist-info | xz -T0 -9) > .whl072/flashinfer-0.7.2-pruned-site.tar.xz
du -sh .whl .whl072 .jit 2>/dev/null || true
carry=$(du -sb --exclude=.git --exclude=.venv --exclude=.jit-so --exclude='*.egg-info' --exclude=__pycache__ \
  --exclude=tools/results . | cut -f1)
awk -v b="$carry" 'BEGIN { printf "carry with tools/results moved out: %.1f MiB of 64%s\n", b / 1048576,
  (b > 64 * 1048576) ? " (over: carry a smaller .jit, tools/jit_merge.sh)" : "" }'
