#!/usr/bin/env bash
# Air-gapped deployment, step 1, on a machine with network, from the project's root: the packages
# attn-dispatch's GPU backends import, fetched for the GPU machine's Python and platform (not this
# machine's) and packed as two xz'd site trees in $ATTN_OFFLINE_DIR (default .offline):
#   site.tar.xz        every package but FlashInfer: cuDNN's frontend, pydantic's stack, tvm-ffi
#   flashinfer.tar.xz  FlashInfer, its kernel sources pruned to what attention builds on Hopper
#                      (about 13 MB against a 65 MB wheel): the MoE, GEMM and Blackwell-only sources
#                      go; cutlass, cccl and the headers stay, as fa3's JIT builds need them
# torch is the GPU machine's own. On it, `. tools/offline/activate.sh` installs these.
#
#   tools/offline/pack_wheels.sh                   # the set below
#   tools/offline/pack_wheels.sh NAME==VER ...     # and these packages into site.tar.xz
#
# The target: PYTHON_VERSION (default 3.12) on x86-64 Linux (PLATFORMS, pip's --platform tags);
# FLASHINFER (default 0.7.2) and PACKAGES (default: the versions below, the ones tested) override the set.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dir=${ATTN_OFFLINE_DIR:-.offline}
python_version=${PYTHON_VERSION:-3.12}
platforms=${PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any"}
flashinfer=${FLASHINFER:-0.7.2}
packages=${PACKAGES:-"nvidia-cudnn-frontend==1.32.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0
  typing-inspection==0.4.5 typing-extensions==4.16.0 apache-tvm-ffi==0.1.15.post2"}
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
platform_args=$(for p in $platforms; do printf -- '--platform %s ' "$p"; done)
# shellcheck disable=SC2086 # the lists split into words on purpose
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  $platform_args -d "$work/wheels" $packages "flashinfer-python==$flashinfer" "$@"
mkdir -p "$work/site" "$work/flashinfer" "$dir"
for w in "$work"/wheels/*.whl; do  # unzip keeps the files' modes; the trees are what pip --target makes
  case "$w" in *flashinfer_python*) unzip -q -o "$w" -d "$work/flashinfer";; *) unzip -q -o "$w" -d "$work/site";; esac
done
(cd "$work/flashinfer/flashinfer/data/csrc" && rm -rf cake_* kda fused_moe gdn experimental blackwell_* alphamoe* \
  cute_sm12x_gemm sparse_mla_sm120 gated_act_mxfp8 trtllm_fused_moe* fmha_v2)
(cd "$work/site" && tar c . | xz -T0 -9) > "$dir/site.tar.xz"
(cd "$work/flashinfer" && tar c . | xz -T0 -9) > "$dir/flashinfer.tar.xz"
du -sh "$dir"/*.tar.xz
