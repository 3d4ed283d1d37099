"""FlashAttention-3 (Hopper): Dao-AILab ``flash_attn_interface`` first, FlashInfer's fa3 kernels second.

Capability data: capability_db/backends/fa3.json, the dtype rules included (K/V dtype = Q's;
out = Q's, bf16 for fp8 Q). Provider-only limits (FlashInfer fa3: head dims 64/128/256,
16-bit only) surface as plan-time BackendRejected reasons.
"""
from __future__ import annotations

from backends._fi_prefill import FlashInferPrefill
from backends._flash_attn import DaoFA3
from backends._providers import MultiProviderBackend


class FA3Backend(MultiProviderBackend):
    name = "fa3"
    packages = ("flash_attn_interface", "flashinfer")
    providers = (DaoFA3(), FlashInferPrefill("fa3"))
