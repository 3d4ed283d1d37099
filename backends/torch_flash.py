"""PyTorch's bundled FA2 (aten._flash_attention_forward): STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class TorchFlashBackend(Backend):
    name = "torch-flash"

    def available(self):
        return Reason("adapter torch-flash", "not implemented yet", "a finished adapter")
