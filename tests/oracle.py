"""The tests' fp64 oracle is the package's (dispatch/benchmark/oracle.py): one oracle, shared with
tools/, ``attn-dispatch probe`` and ``attn-dispatch bench``."""
from dispatch.benchmark.oracle import (BANDS, LN2, allowed_keys, as_float, attention_fp64, band,
                                   batch_attention_fp64, e4m3_ulp, e4m3_ulps_off, pack_spec_bits,
                                   packbits_little, query_positions, relative_error, rope_llama,
                                   spec_decode_mask, stored_e4m3)

__all__ = ["BANDS", "LN2", "allowed_keys", "as_float", "attention_fp64", "band", "batch_attention_fp64",
           "e4m3_ulp", "e4m3_ulps_off", "pack_spec_bits", "packbits_little", "query_positions", "relative_error",
           "rope_llama", "spec_decode_mask", "stored_e4m3"]
