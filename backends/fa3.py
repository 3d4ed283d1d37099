"""FlashAttention-3 (flash_attn_interface / FlashInfer fa3): STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class FA3Backend(Backend):
    name = "fa3"

    def available(self):
        return Reason("adapter fa3", "not implemented yet", "a finished adapter")
