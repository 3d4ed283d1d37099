"""attn-dispatch: a drop-in for FlashInfer's attention entry points (``import dispatch``)."""
from __future__ import annotations

from .policy import strict, use_backend
from .problem import AttentionBatch, AttentionProblem
from .router import BackendRefusedError, Decision, NoBackendError

__all__ = [
    "AttentionBatch", "AttentionProblem", "BackendRefusedError", "Decision", "NoBackendError",
    "strict", "use_backend",
]

# FlashInfer-compatible entry points (added by the API work; the names above are unchanged).
from .decode import xqa_batch_decode_with_kv_cache  # noqa: E402
from .explain import explain  # noqa: E402
from .entries._base import last_decision  # noqa: E402
from .prefill import (cudnn_batch_prefill_with_kv_cache, single_prefill_with_kv_cache,  # noqa: E402
                      single_prefill_with_kv_cache_return_lse, trtllm_batch_context_with_kv_cache)
from .wrappers import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper  # noqa: E402
from . import autotune  # noqa: E402  (callable: dispatch.autotune() turns online autotune on)

__all__ += [
    "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
    "cudnn_batch_prefill_with_kv_cache", "explain", "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse", "trtllm_batch_context_with_kv_cache",
    "xqa_batch_decode_with_kv_cache", "autotune", "last_decision",
]
