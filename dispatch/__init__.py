"""attn-dispatch: a drop-in for FlashInfer's attention entry points (``import dispatch``)."""
from __future__ import annotations

from .policy import strict, use_backend
from .problem import AttentionBatch, AttentionProblem
from .router import BackendRefusedError, Decision, NoBackendError

__all__ = [
    "AttentionBatch", "AttentionProblem", "BackendRefusedError", "Decision", "NoBackendError",
    "strict", "use_backend",
]
