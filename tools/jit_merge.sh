# Here, after a device call that ran tools/jit_pack.sh: add the modules it brought back (under
# the call's files_at folder, given as $1) to .jit-so/, and pack a selection of .jit-so/ into .jit/
# as 15 MB parts for the next call's carry. The carry is 64 MiB in all: the wheels take 38 MB and
# the tree 12 MB (tools/results moved out), so .jit must stay under about 15 MB; all of .jit-so
# (95 modules) packs to 56 MB. Kept: the fa3 (sm90) modules, the slowest to compile (about 70 s
# each), and fa2's bf16 head-dim-128 batch modules (26 modules, 11 MB); the rest compile on the
# machine. $SELECT overrides the pattern (an extended regex).
set -e
select=${SELECT:-'_sm90$|^quantization$|^batch_prefill.*dtype_q_bf16_dtype_kv_bf16.*head_dim_qk_128_.*kv_stride_equal$'}
mkdir -p .jit-so .jit
if ls "$1"/jit-so.tar.xz.* >/dev/null 2>&1; then cat "$1"/jit-so.tar.xz.* | xz -d | tar x -C .jit-so; fi
rm -f .jit/jit-so.tar.xz.*
(cd .jit-so && ls | grep -E "$select" | tar c -T - | xz -T0 -6 | split -b 15M - ../.jit/jit-so.tar.xz.)
du -sh .jit-so .jit
