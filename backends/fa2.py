"""FlashAttention-2: Dao-AILab ``flash_attn`` first, FlashInfer's own fa2 kernels second.

Capability data: capability_db/backends/fa2.json (what *some* provider serves);
the dtype rules (out dtype = Q's) are data there too. Provider-only limits (flash_attn: pages
a multiple of 256, no custom mask/RoPE, no fp8 KV) live with the providers and surface as
plan-time BackendRejected reasons.
"""
from __future__ import annotations

from backends._fi_prefill import FlashInferPrefill
from backends._flash_attn import DaoFA2
from backends._providers import MultiProviderBackend


class FA2Backend(MultiProviderBackend):
    name = "fa2"
    packages = ("flash_attn", "flashinfer")
    providers = (DaoFA2(), FlashInferPrefill("fa2"))
