"""attn-dispatch: a drop-in for FlashInfer's attention entry points (``import dispatch``)."""
from __future__ import annotations

import warnings as _warnings

# NumPy is not a dependency; without it ``import torch`` warns "Failed to initialize NumPy" (the
# first line a user of `attn-dispatch --help` would read): exactly that message is silenced, only
# while torch is first imported here (a broken NumPy still warns).
with _warnings.catch_warnings():
    _warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy: No module named 'numpy",
                             category=UserWarning)
    import torch as _torch
del _torch  # imported for the filter above; the modules below import it again

from ._version import __version__  # noqa: E402
from .policy import strict, use_backend  # noqa: E402
from .problem import AttentionBatch, AttentionProblem  # noqa: E402
from .router import BackendRefusedError, Decision, NoBackendError  # noqa: E402

__all__ = [
    "AttentionBatch", "AttentionProblem", "BackendRefusedError", "Decision", "NoBackendError",
    "strict", "use_backend", "__version__",
]

# FlashInfer-compatible entry points.
from .decode import xqa_batch_decode_with_kv_cache  # noqa: E402
from .explain import explain  # noqa: E402
from .entries import last_decision  # noqa: E402
from .prefill import (cudnn_batch_prefill_with_kv_cache, single_prefill_with_kv_cache,  # noqa: E402
                      single_prefill_with_kv_cache_return_lse, trtllm_batch_context_with_kv_cache)
from .wrappers import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper  # noqa: E402
from . import autotune  # noqa: E402  (callable: with dispatch.autotune(True, cache=...): the warm-up autotune)

__all__ += [
    "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
    "cudnn_batch_prefill_with_kv_cache", "explain", "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse", "trtllm_batch_context_with_kv_cache",
    "xqa_batch_decode_with_kv_cache", "autotune", "last_decision",
]
