# The FlashInfer modules this machine compiled, into $OUT as jit-so.tar.xz.aa, .ab, ... (15 MB
# parts; the device tool brings back files of at most 16 MiB). Here, tools/jit_merge.sh adds them
# to .jit for the next machine (tools/gpu_env.sh installs them there).
stage=/tmp/jit-stage && rm -rf $stage && mkdir -p $stage
find ${FLASHINFER_WORKSPACE_BASE:-/tmp/fi072} -name '*.so' -path '*cached_ops*' | while read -r so; do
  name=$(basename "$so" .so); mkdir -p $stage/$name && ln "$so" $stage/$name/ 2>/dev/null || cp "$so" $stage/$name/
done
(cd $stage && tar c . | xz -T0 -6 | split -b 15M - "$OUT/jit-so.tar.xz.") && ls -la $OUT/jit-so.tar.xz.* >&2
