"""TensorRT-LLM trtllm-gen context attention: STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class TrtllmGenBackend(Backend):
    name = "trtllm-gen"

    def available(self):
        return Reason("adapter trtllm-gen", "not implemented yet", "a finished adapter")
