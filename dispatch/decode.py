"""The decode entry point, where FlashInfer has it (``flashinfer.decode``)."""
from __future__ import annotations

from .entries.xqa import xqa_batch_decode_with_kv_cache

__all__ = ["xqa_batch_decode_with_kv_cache"]
