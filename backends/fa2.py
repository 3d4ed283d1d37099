"""FlashAttention-2 (flash_attn / FlashInfer fa2): STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class FA2Backend(Backend):
    name = "fa2"

    def available(self):
        return Reason("adapter fa2", "not implemented yet", "a finished adapter")
