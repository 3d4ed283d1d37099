"""One module per FlashInfer calling convention, and ENTRIES, the registry of the seven entry points.

``explain``, the CLI and the tests read ENTRIES: each record names the public object, where
FlashInfer has it, and the seed document that fixes its signature.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _base
from ._base import dry_run, last_decision
from ._wrapper import PrefillWrapper
from .cudnn import cudnn_batch_prefill_with_kv_cache
from .paged import BatchPrefillWithPagedKVCacheWrapper
from .ragged import BatchPrefillWithRaggedKVCacheWrapper
from .single import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse
from .trtllm import trtllm_batch_context_with_kv_cache
from .xqa import xqa_batch_decode_with_kv_cache


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any  # the function, functools.partial or wrapper class users call
    flashinfer: str  # where FlashInfer has it
    seed_doc: str  # the seed document (tests/seed_docs/) that fixes its signature
    kind: str  # "function" | "wrapper"


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("cudnn_batch_prefill_with_kv_cache", cudnn_batch_prefill_with_kv_cache,
          "flashinfer.prefill.cudnn_batch_prefill_with_kv_cache", "000_482ad404dfaf4ef7.txt", "function"),
    Entry("trtllm_batch_context_with_kv_cache", trtllm_batch_context_with_kv_cache,
          "flashinfer.prefill.trtllm_batch_context_with_kv_cache", "001_f3928b48024058a9.txt", "function"),
    Entry("BatchPrefillWithPagedKVCacheWrapper", BatchPrefillWithPagedKVCacheWrapper,
          "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper", "002_39713a37e348626a.txt", "wrapper"),
    Entry("BatchPrefillWithRaggedKVCacheWrapper", BatchPrefillWithRaggedKVCacheWrapper,
          "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper", "002_39713a37e348626a.txt", "wrapper"),
    Entry("single_prefill_with_kv_cache", single_prefill_with_kv_cache,
          "flashinfer.prefill.single_prefill_with_kv_cache", "002_39713a37e348626a.txt", "function"),
    Entry("single_prefill_with_kv_cache_return_lse", single_prefill_with_kv_cache_return_lse,
          "flashinfer.prefill.single_prefill_with_kv_cache_return_lse", "004_0137897dda950493.txt", "function"),
    Entry("xqa_batch_decode_with_kv_cache", xqa_batch_decode_with_kv_cache,
          "flashinfer.decode.xqa_batch_decode_with_kv_cache", "003_6e851eab59e17265.txt", "function"),
)}


def clear_caches() -> None:
    """Forget every cached call key and problem (tests; after changing the environment)."""
    _base.clear_caches()


__all__ = ["ENTRIES", "Entry", "PrefillWrapper", "clear_caches", "dry_run", "last_decision",
           "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper", "cudnn_batch_prefill_with_kv_cache",
           "single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse", "trtllm_batch_context_with_kv_cache",
           "xqa_batch_decode_with_kv_cache"]
