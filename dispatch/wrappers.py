"""The two batch prefill wrappers (kept for imports of ``dispatch.wrappers``)."""
from __future__ import annotations

from .entries.paged import BatchPrefillWithPagedKVCacheWrapper
from .entries.ragged import BatchPrefillWithRaggedKVCacheWrapper

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]
