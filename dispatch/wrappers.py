"""FlashInfer-compatible batch prefill wrappers: plan once (validation, index conversion, routing),
run per layer (cheap checks, launch).

``plan`` copies the index tensors to the host (it may synchronize), converts FlashInfer's
(indptr, indices, last_page_len) page lists to a block table + kv_lens on the workspace's
device once, unpacks custom masks once, and calls ``router.decide`` + ``router.plan``. The
backend's plan then sees a *shape-only* batch: q/k/v/out are stride-0 views with the planned
shapes and dtypes (no memory), index tensors are the real ones. ``run`` performs no host
synchronization and allocates nothing but ``out``/``lse`` when they are not given (tensor
scales are multiplied on the device). A run-time argument that changes the problem (sinks, an
LSE, trtllm-gen's window_left override) is decided and planned once per variant.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any, Optional

import torch

from . import policy, router, specs
from . import _entry as E
from ._normalize import (bad, block_table_from_pages, cumsum0, fold_scale, full_validation, unpack_bits)
from .problem import AttentionBatch, AttentionProblem, dtype_name


class _Wrapper:
    _entry = ""
    _storage = ""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto",
                 jit_args=None, jit_kwargs=None):
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise bad("float_workspace_buffer", float_workspace_buffer, "a torch.Tensor", TypeError)
        if kv_layout not in ("NHD", "HND"):
            raise bad("kv_layout", kv_layout, "'NHD' or 'HND'")
        if jit_args is not None or jit_kwargs is not None:
            raise bad("jit_args", jit_args, "None (JIT variants are not supported)")
        policy.normalize_backend_name(backend)  # unknown names fail here, with the valid options
        self._device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = policy._ALIASES.get(backend, backend)
        self._plan: Optional[SimpleNamespace] = None

    # -- plan -------------------------------------------------------------------------------------
    def _finish_plan(self, spec, d, kv_storage_fields: dict) -> None:
        dev = self._device
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        custom = self._plan_mask(spec, q_lens, d.kv_lens)
        sm_scale = spec.sm_scale if spec.sm_scale is not None else 1.0 / math.sqrt(d.dqk)
        self._plan = p = SimpleNamespace(
            **vars(d), backend=self._backend, layout=self._kv_layout,
            window_left=spec.window_left, total_q=d.qo[-1] - d.qo[0], sm_scale=sm_scale,
            qo_indptr=torch.tensor(d.qo, dtype=torch.int32, device=dev),
            kv_lens_t=torch.tensor(d.kv_lens, dtype=torch.int32, device=dev),
            max_q=max(q_lens, default=0), max_kv=max(d.kv_lens, default=0), custom_mask=custom,
            mask_indptr=torch.tensor(cumsum0([a * b for a, b in zip(q_lens, d.kv_lens)]), dtype=torch.int32,
                                     device=dev) if custom is not None else None, **kv_storage_fields)
        p.problem = AttentionProblem(
            entry=self._entry, phase="decode" if q_lens and all(n == 1 for n in q_lens) else "prefill",
            kv_storage=self._storage, kv_layout="HND" if p.cudnn else self._kv_layout, num_qo_heads=d.hq,
            num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo, q_dtype=dtype_name(d.q_dtype),
            kv_dtype=dtype_name(d.kv_dtype), out_dtype=dtype_name(d.out_dtype),
            page_size=getattr(p, "page_size", 0), causal=spec.causal, window_left=spec.window_left,
            mask="custom" if custom is not None else "none", logits_soft_cap=float(spec.logits_soft_cap or 0.0),
            pos_encoding=spec.pos_encoding_mode, rope_scale=float(spec.rope_scale or 1.0),
            rope_theta=float(spec.rope_theta or 1e4), device_type="cpu" if dev.type == "cpu" else "cuda",
            cuda_graph=self._use_cuda_graph)
        self._explicit = policy.explicit_choice(self._backend)
        self._variants: dict[tuple, router.Planned] = {}
        self._run_sigs: set = set()
        self._last = self._variant(False, False, spec.window_left, self._shape_only_batch())

    def _plan_mask(self, spec, q_lens, kv_lens):
        sizes = [a * b for a, b in zip(q_lens, kv_lens)]
        if spec.custom_mask is not None:
            return spec.custom_mask.reshape(-1).to(self._device)
        if spec.packed_custom_mask is not None:
            return unpack_bits(spec.packed_custom_mask.to(self._device), [(n + 7) // 8 for n in sizes], sizes)
        return None

    def _shape_only_batch(self) -> AttentionBatch:
        p, dev = self._plan, self._device
        def view(shape, dtype):  # stride-0 view: right shape/dtype/device, no memory
            return torch.empty((1,) * len(shape), dtype=dtype, device=dev).expand(*shape)
        kv_rows = self._kv_shape()
        return self._batch(view((p.total_q, p.hq, p.dqk), p.q_dtype), view(kv_rows + (p.dqk,), p.kv_dtype),
                           view(kv_rows + (p.dvo,), p.kv_dtype), view((p.total_q, p.hq, p.dvo), p.out_dtype),
                           None, None, p.sm_scale, 1.0)

    # -- run --------------------------------------------------------------------------------------
    def _variant(self, has_sinks: bool, wants_lse: bool, window_left: int, batch) -> router.Planned:
        key = (has_sinks, wants_lse, window_left)
        planned = self._variants.get(key)
        if planned is None:
            problem = self._plan.problem
            if key != (False, False, problem.window_left):
                problem = AttentionProblem(**{**vars(problem), "has_sinks": has_sinks, "return_lse": wants_lse,
                                              "window_left": window_left})
            decision = router.decide(problem, router.live_device(batch.q), self._explicit)
            planned = self._variants[key] = router.plan(decision, batch)
        return planned

    def _check_run(self, spec_cls, args: dict, sig: tuple):
        if self._plan is None:
            raise RuntimeError(f"{type(self).__name__}.run() before plan(): call plan(...) first")
        args["planned"] = self._plan
        if sig not in self._run_sigs:
            _, d = specs.validate(spec_cls, args)
            self._run_sigs.add(sig)
            return d
        return spec_cls.fast(args, values=args["q"].device.type == "cpu" or full_validation())[1]

    def _launch(self, q, k, v, out, lse, return_lse, sinks, window_left, sm_scale, out_scale):
        p = self._plan
        out = out if out is not None else torch.empty(p.total_q, p.hq, p.dvo, dtype=p.out_dtype, device=q.device)
        wants_lse = return_lse or lse is not None
        if wants_lse and lse is None:
            lse = torch.empty(p.total_q, p.hq, dtype=torch.float32, device=q.device)
        batch = self._batch(q, k, v, out, lse, sinks, sm_scale, out_scale)
        window = p.window_left if window_left is None else window_left
        planned = self._variant(sinks is not None, wants_lse, window, batch)
        self._last = router.run(planned, batch)
        return (out, lse) if return_lse else out

    def _batch(self, q, k, v, out, lse, sinks, sm_scale, out_scale) -> AttentionBatch:
        p = self._plan
        return AttentionBatch(
            q=q, k=k, v=v, qo_indptr=p.qo_indptr, kv_lens=p.kv_lens_t, out=out, batch_size=len(p.kv_lens),
            max_q_len=p.max_q, max_kv_len=p.max_kv, sm_scale=sm_scale, out_scale=out_scale,
            kv_indptr=getattr(p, "kv_indptr_t", None), block_table=getattr(p, "block_table", None), lse=lse,
            sinks=sinks, custom_mask=p.custom_mask, mask_indptr=p.mask_indptr)

    @property
    def decision(self) -> Optional[router.Decision]:
        """The router's decision for the latest plan/run (chosen, rejected with reasons, fallbacks)."""
        return self._last.decision if self._plan is not None else None


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """Paged-KV batch prefill (FlashInfer ``BatchPrefillWithPagedKVCacheWrapper``)."""

    _entry = "BatchPrefillWithPagedKVCacheWrapper"
    _storage = "paged"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False):
        """Validate, convert the page lists to a block table + kv_lens once, decide and plan."""
        args = dict(locals())
        args.pop("self")
        args["backend"] = self._backend
        spec, d = specs.validate(specs.PagedPlanSpec, args)
        if d.cudnn:
            table = block_tables.to(self._device)
        else:
            table = block_table_from_pages(d.kv_indptr, paged_kv_indices, self._device)
        self._finish_plan(spec, d, {"block_table": table, "page_size": page_size})

    begin_forward = plan

    def _kv_shape(self):
        p = self._plan
        return (p.max_page_id + 1, p.page_size, p.hkv)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None):
        """Attention of q over the planned paged cache; (out, lse) when return_lse."""
        a = dict(q=q, paged_kv_cache=paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
                 lse=lse, return_lse=return_lse, window_left=window_left, sinks=sinks, kv_cache_sf=kv_cache_sf,
                 extra_args=args)
        d = self._check_run(specs.PagedRunSpec, a, E.signature("paged-run", a, full=("sinks",),
                                                               sizes=("q_scale", "k_scale", "v_scale")))
        sm_scale = fold_scale(self._plan.sm_scale, q_scale, k_scale)
        return self._launch(q, d.k, d.v, out, lse, return_lse, sinks, window_left, sm_scale,
                            fold_scale(1.0, v_scale))

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, causal=None, pos_encoding_mode=None, sm_scale=None, **kwargs):
        """Deprecated FlashInfer alias of run (plan-time arguments given here must match plan)."""
        return self.run(q, paged_kv_cache, **kwargs)

    def forward_return_lse(self, q, paged_kv_cache, k_scale=None, v_scale=None, **kwargs):
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True, **kwargs)


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """Ragged-KV batch prefill (FlashInfer ``BatchPrefillWithRaggedKVCacheWrapper``)."""

    _entry = "BatchPrefillWithRaggedKVCacheWrapper"
    _storage = "ragged"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv=False, seq_lens=None, seq_lens_q=None,
             max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None, o_indptr=None):
        """Validate the token (or, with backend='cudnn', element) indptrs once, decide and plan."""
        args = dict(locals())
        args.pop("self")
        args["backend"] = self._backend
        spec, d = specs.validate(specs.RaggedPlanSpec, args)
        kv_t = torch.tensor(d.kv_indptr, dtype=torch.int32, device=self._device)
        self._finish_plan(spec, d, {"kv_indptr_t": kv_t, "total_kv": d.kv_indptr[-1]})

    begin_forward = plan

    def _kv_shape(self):
        p = self._plan
        return (p.total_kv, p.hkv)

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, kv_cache_sf=None):
        """Attention of q over ragged k/v; out = v_scale/o_scale * softmax(sm_scale*q_scale*k_scale q.k) v."""
        a = dict(q=q, k=k, v=v, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, o_scale=o_scale, out=out,
                 lse=lse, return_lse=return_lse, kv_cache_sf=kv_cache_sf, extra_args=args)
        self._check_run(specs.RaggedRunSpec, a, E.signature("ragged-run", a, loose=("k", "v"),
                                                            sizes=("q_scale", "k_scale", "v_scale", "o_scale")))
        sm_scale = fold_scale(self._plan.sm_scale, q_scale, k_scale)
        inv_o = None if o_scale is None else (1.0 / o_scale if not isinstance(o_scale, torch.Tensor) else o_scale.reciprocal())
        return self._launch(q, k, v, out, lse, return_lse, None, None, sm_scale, fold_scale(1.0, v_scale, inv_o))

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, k, v, causal=None, pos_encoding_mode=None, sm_scale=None, **kwargs):
        return self.run(q, k, v, **kwargs)

    def forward_return_lse(self, q, k, v, k_scale=None, v_scale=None, **kwargs):
        return self.run(q, k, v, k_scale=k_scale, v_scale=v_scale, return_lse=True, **kwargs)
