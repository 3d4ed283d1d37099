# The FlashInfer modules this machine compiled, into $OUT as jit-so.tar.xz.aa, .ab, ... (15 MB
# parts; the device tool brings back files of at most 16 MiB). Here, tools/jit_merge.sh adds them
# to .jit for the next machine (tools/gpu_env.sh installs them there).
stage=/tmp/jit-stage && rm -rf $stage && mkdir -p $stage
find ${FLASHINFER_WORKSPACE_BASE:-/tmp/fi072} -name '*.so' -path '*cached_ops*' | while read -r so; do
  name=$(basename "$so" .so); mkdir -p $stage/$name && ln "$so" $stage/$name/ 2>/dev/null || cp "$so" $stage/$name/
done
(cd $stage && tar c . | xz -T0 -6 | split -b 15M - "$OUT/jit-so.tar.xz.") && ls -la $OUT/jit-so.tar.xz.* >&2
# Triton's cache (the native-triton kernels this machine compiled, the carried ones with them) as
# triton-cache.tar.xz when under 15 MB: tools/jit_merge.sh keeps it in .jit, tools/gpu_env.sh puts
# it back where Triton looks. Its size and kernel count go to the log either way.
triton=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -d "$triton" ]; then
  (cd "$triton" && tar c . | xz -T0 -6) > /tmp/triton-cache.tar.xz
  bytes=$(stat -c %s /tmp/triton-cache.tar.xz)
  echo "jit_pack: Triton cache $(ls "$triton" | wc -l) entries, $bytes bytes packed" >&2
  if [ "$bytes" -lt 15000000 ]; then cp /tmp/triton-cache.tar.xz "$OUT/"; fi
fi
