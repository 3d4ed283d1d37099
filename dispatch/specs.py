"""The spec models of the seven entry points and the shared check helpers, in one namespace.

The models live in ``_specs_entries`` (trtllm, xqa), ``_specs_more`` (cuDNN) and
``_specs_wrappers`` (the wrappers' plan/run, single prefill), on top of ``_spec_base`` (the
``_Spec`` base with its three check groups, ``validate`` and the ``need_*`` helpers); this
module only gathers them, so the imports run one way.
"""
from __future__ import annotations

from ._spec_base import (OUT_DTYPES, Q_DTYPES, _Spec, need_finite, need_soft_cap, need_window,
                         validate)
from ._specs_entries import TrtllmContextSpec, XqaDecodeSpec
from ._specs_more import CudnnPrefillSpec
from ._specs_wrappers import PagedPlanSpec, PagedRunSpec, RaggedPlanSpec, RaggedRunSpec, SinglePrefillSpec

__all__ = ["OUT_DTYPES", "Q_DTYPES", "_Spec", "need_finite", "need_soft_cap", "need_window", "validate",
           "CudnnPrefillSpec", "PagedPlanSpec", "PagedRunSpec", "RaggedPlanSpec",
                               "RaggedRunSpec", "SinglePrefillSpec", "TrtllmContextSpec", "XqaDecodeSpec"]
