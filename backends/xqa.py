"""TensorRT-LLM XQA decode: STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class XqaBackend(Backend):
    name = "xqa"

    def available(self):
        return Reason("adapter xqa", "not implemented yet", "a finished adapter")
