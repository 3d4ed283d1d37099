"""attn-dispatch native Triton kernels: STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class NativeTritonBackend(Backend):
    name = "native-triton"

    def available(self):
        return Reason("adapter native-triton", "not implemented yet", "a finished adapter")
