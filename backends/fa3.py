"""FlashAttention-3 (Hopper): Dao-AILab ``flash_attn_interface`` first, FlashInfer's fa3 kernels second.

Capability data: capability_db/backends/fa3.json; provider-only limits (FlashInfer fa3:
head dims 64/128/256, 16-bit only) surface as plan-time BackendRejected reasons.
"""
from __future__ import annotations

from backends._fi_prefill import FlashInferPrefill
from backends._flash_attn import DaoFA3
from backends._providers import MultiProviderBackend
from backends.base import Reason

_FP8 = ("float8_e4m3fn",)


class FA3Backend(MultiProviderBackend):
    name = "fa3"
    packages = ("flash_attn_interface", "flashinfer")
    providers = (DaoFA3(), FlashInferPrefill("fa3"))

    def extra_checks(self, problem, device) -> list[Reason]:
        want = "bfloat16" if problem.q_dtype in _FP8 else problem.q_dtype
        if problem.out_dtype != want:
            return [Reason("out_dtype", problem.out_dtype, f"{want!r} (fp8 inputs give bf16 output, else q_dtype)",
                           "vendor-constraints.md section 6 (hopper/flash_api.cpp L855-863)")]
        if problem.kv_dtype != problem.q_dtype:
            return [Reason("kv_dtype", problem.kv_dtype, f"equal to q_dtype {problem.q_dtype!r}",
                           "vendor-constraints.md section 6 (hopper/flash_api.cpp L714-722)")]
        return []
