# Here, after a device call that ran tools/jit_pack.sh: add the modules it brought back (under
# the call's files_at folder, given as $1) to .jit-so/, and pack a selection of .jit-so/ into .jit/
# as 15 MB parts for the next call's carry (tools/gpu_env.sh installs them there).
# The carry is 64 MiB in all: the wheels take 23 MB (tools/carry_prep.sh; 30 before session 20) and
# the tree 8 MB (tools/results moved out), so .jit may take about 30 MB. The modules are stripped of
# their symbols (strip --strip-unneeded: 109 -> 94 MB for session 18's 33) and packed with xz -9.
# Which go: what tools/jit_prebuild.py --carry-mb picks within $JIT_MB (default 40, less Triton's
# cache where .jit holds one): the modules it cannot place first, then by device seconds saved per
# MB (run this with the project's venv active); or $SELECT, an extended regex over the module names.
# $JIT_MB counts each module xz'd alone (0.3-1.3 MB: their GPU code is compressed already); packed
# together they take about 0.72 of that (session 20: 40 -> 28 MB, 67 of 88 modules, a carry of 57.5
# MiB). tools/carry_prep.sh prints the carry's size.
# Whether FlashInfer loads carried modules rather than compiling them again was never checked on a
# device before session 20; tools/gpu_env.sh now loads each once and says which fail.
set -e
mkdir -p .jit-so .jit
if ls "$1"/jit-so.tar.xz.* >/dev/null 2>&1; then cat "$1"/jit-so.tar.xz.* | xz -d | tar x -C .jit-so; fi
if [ -f "$1"/triton-cache.tar.xz ]; then cp "$1"/triton-cache.tar.xz .jit/; fi  # tools/jit_pack.sh: whole
if command -v strip >/dev/null; then find .jit-so -name '*.so' -exec strip --strip-unneeded {} +; fi
triton_mb=$(( $(stat -c %s .jit/triton-cache.tar.xz 2>/dev/null || echo 0) / 1000000 ))
if [ -n "${SELECT:-}" ]; then (cd .jit-so && ls | grep -E "$SELECT") > /tmp/jit-carry.txt
else python3 tools/jit_prebuild.py --out .jit-so --carry-mb $(( ${JIT_MB:-40} - triton_mb )) > /tmp/jit-carry.txt; fi
rm -f .jit/jit-so.tar.xz.*
(cd .jit-so && tar c -T /tmp/jit-carry.txt | xz -T0 -9 | split -b 15M - ../.jit/jit-so.tar.xz.)
echo "jit_merge: $(wc -l < /tmp/jit-carry.txt) of $(ls .jit-so | wc -l) modules in .jit"
du -sh .jit-so .jit
