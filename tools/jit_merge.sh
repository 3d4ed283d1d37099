# Here, after a device call that ran tools/jit_pack.sh: add the modules it brought back (under
# the call's files_at folder, given as $1) to .jit-so/, and pack all of .jit-so/ into .jit/ as
# 15 MB parts for the next call's carry (keep .jit under about 20 MB: the carry is 64 MiB in all).
set -e
mkdir -p .jit-so .jit
if ls "$1"/jit-so.tar.xz.* >/dev/null 2>&1; then cat "$1"/jit-so.tar.xz.* | xz -d | tar x -C .jit-so; fi
rm -f .jit/jit-so.tar.xz.*
(cd .jit-so && tar c . | xz -T0 -6 | split -b 15M - ../.jit/jit-so.tar.xz.)
du -sh .jit-so .jit
