"""cuDNN SDPA (nvidia-cudnn-frontend graph API): STUB, replaced by its adapter."""
from __future__ import annotations

from backends.base import Backend, Reason


class CudnnBackend(Backend):
    name = "cudnn"

    def available(self):
        return Reason("adapter cudnn", "not implemented yet", "a finished adapter")
