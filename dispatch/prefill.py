"""The prefill entry points, where FlashInfer has them (``flashinfer.prefill``)."""
from __future__ import annotations

from .entries.cudnn import cudnn_batch_prefill_with_kv_cache
from .entries.paged import BatchPrefillWithPagedKVCacheWrapper
from .entries.ragged import BatchPrefillWithRaggedKVCacheWrapper
from .entries.single import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse
from .entries.trtllm import trtllm_batch_context_with_kv_cache

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
           "cudnn_batch_prefill_with_kv_cache", "single_prefill_with_kv_cache",
           "single_prefill_with_kv_cache_return_lse", "trtllm_batch_context_with_kv_cache"]
