# Here, after a device call that ran tools/jit_pack.sh: add the modules it brought back (under
# the call's files_at folder, given as $1) to .jit-so/, and pack a selection of .jit-so/ into .jit/
# as 15 MB parts for the next call's carry. The carry is 64 MiB in all: the wheels take 30 MB
# (tools/carry_prep.sh) and, since session 19, the tree 8 MB (tools/results moved out; h200.json
# 6.5 MB, its rows naming their own files), so .jit may take about 25 MB. The modules are stripped of their symbols (strip
# --strip-unneeded: 109 -> 94 MB for session 18's 33; 25 of them, so stripped, went to a fresh H200,
# whose sweep ran, though whether FlashInfer loaded them rather than compiling again was not checked)
# and packed with xz -9 (about 0.5 MB a module). Kept: every module in .jit-so/ (since session 20, when
# tools/jit_prebuild.py began building the most needed ones here, off the GPU); $SELECT, an extended
# regex over the module names, keeps fewer where the carry would pass 64 MiB (tools/carry_prep.sh
# prints it).
set -e
select=${SELECT:-'.'}
mkdir -p .jit-so .jit
if ls "$1"/jit-so.tar.xz.* >/dev/null 2>&1; then cat "$1"/jit-so.tar.xz.* | xz -d | tar x -C .jit-so; fi
if [ -f "$1"/triton-cache.tar.xz ]; then cp "$1"/triton-cache.tar.xz .jit/; fi  # tools/jit_pack.sh: whole
if command -v strip >/dev/null; then find .jit-so -name '*.so' -exec strip --strip-unneeded {} +; fi
rm -f .jit/jit-so.tar.xz.*
(cd .jit-so && ls | grep -E "$select" | tar c -T - | xz -T0 -9 | split -b 15M - ../.jit/jit-so.tar.xz.)
du -sh .jit-so .jit
