"""TensorRT-LLM trtllm-gen context attention via ``flashinfer.prefill.trtllm_batch_context_with_kv_cache``.

Translation (the function's signature and docstring, flashinfer/prefill.py):
* paged only; our logical NHD page views go over in the caller's physical layout
  (kv_layout "NHD" or "HND"), block_table as is; K and V page ids of their own (our v_block_table)
  go as FlashInfer's (batch, 2, pages) table with ``uses_shared_paged_kv_idx=False`` (>= 0.6.10);
* ``seq_lens`` = our kv_lens (total keys incl. the new tokens); cum_seq_lens_q = qo_indptr;
  cum_seq_lens_kv is ignored by the kernel for paged KV, we pass the kv token prefix sums;
* bmm1_scale = sm_scale, bmm2_scale = out_scale (float or device tensor: CUDA-graph safe);
* window_left as is (the kernel uses window_left + 1 keys), sinks (Hq,) fp32 raw logits;
* LSE: the kernel's is already (total_q, Hq) fp32 base 2 and is written into ours.
``causal=False`` and the LSE need a FlashInfer whose function has ``causal``/``lse``
(>= 0.6.17); older ones are refused at plan time. SM100/103/107 only: never run on our H100.
A float sm_scale < 0 is refused before any launch (_vendor.refuse_negative_scale).
Caches: the zeroed workspace, _vendor.workspace keyed on (tag, device with its index), one per
GPU; launches run under the tensors' GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backends import _vendor
from backends._device import on_device

WORKSPACE_BYTES = 128 * 1024 * 1024  # FI tests use 128-256 MiB
SRC = "flashinfer flashinfer/prefill.py trtllm_batch_context_with_kv_cache"


@dataclass
class TrtllmPlan:
    problem: Any
    fn: Any


class TrtllmGenBackend(_vendor.FlashInferModuleBackend):
    name = "trtllm-gen"
    vendor_module = "flashinfer.prefill"

    def plan(self, problem, batch) -> TrtllmPlan:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "trtllm-gen (bmm1_scale)")
        fn = self._loaded().module.trtllm_batch_context_with_kv_cache
        if not problem.causal and not _vendor.has_param(fn, "causal"):
            raise _vendor.rejected(self.name, "causal", False, "True with this flashinfer (causal= needs >= 0.6.17)", SRC)
        if problem.return_lse and not _vendor.has_param(fn, "lse"):
            raise _vendor.rejected(self.name, "return_lse", True, "False with this flashinfer (lse= needs >= 0.6.17)", SRC)
        if not problem.uses_shared_paged_kv_idx and not _vendor.has_param(fn, "uses_shared_paged_kv_idx"):
            raise _vendor.rejected(self.name, "uses_shared_paged_kv_idx", False,
                                   "True with this flashinfer (separate K/V page tables need >= 0.6.10)", SRC)
        _vendor.workspace("trtllm-gen", batch.q.device, WORKSPACE_BYTES, zeroed=True)
        return TrtllmPlan(problem, fn)

    def run(self, plan: TrtllmPlan, batch) -> None:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "trtllm-gen (bmm1_scale)")  # before launch
        with on_device(batch.q.device):
            self._launch(plan, batch)

    def _launch(self, plan: TrtllmPlan, batch) -> None:
        problem, dev = plan.problem, batch.q.device
        k, v, layout = _vendor.physical_kv(problem, batch.k, batch.v)
        out = _vendor.writable(batch.out)
        kwargs = dict(out=out, out_dtype=out.dtype, kv_layout=layout, sinks=batch.sinks)
        if _vendor.has_param(plan.fn, "causal"):
            kwargs["causal"] = problem.causal
        if batch.lse is not None:
            kwargs["lse"] = batch.lse  # fp32 (total_q, Hq) base 2, filled in place
        table = batch.block_table
        if not problem.uses_shared_paged_kv_idx:  # FlashInfer's form: dim 1 is K's ids (0), V's (1)
            table = torch.stack([batch.block_table, batch.v_block_table], dim=1)
            kwargs["uses_shared_paged_kv_idx"] = False
        plan.fn(
            batch.q, (k, v), _vendor.workspace("trtllm-gen", dev, WORKSPACE_BYTES, zeroed=True),
            table, batch.kv_lens, batch.max_q_len, batch.max_kv_len,
            _vendor.device_scalar(batch.sm_scale, dev), _vendor.device_scalar(batch.out_scale, dev),
            batch.batch_size, batch.qo_indptr, _vendor.cu_seqlens(batch.kv_lens), problem.window_left,
            **kwargs,
        )
        _vendor.write_back(batch.out, out)
