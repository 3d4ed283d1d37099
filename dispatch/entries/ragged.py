"""``BatchPrefillWithRaggedKVCacheWrapper`` (seed 002): batch prefill over ragged (packed) K/V."""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Literal, Optional, Union, overload

import torch

from .. import nvfp4, ops
from ..checks import Scale, bad, check_indptr_values, host_ints, host_lists, need_index, need_tensor
from . import _base as B
from ._base import UNSET
from ._wrapper import PlanSpecBase, PrefillWrapper, RunSpecBase, run_problem, run_sizes

_RUN_PER_CALL = ("q_scale", "k_scale", "v_scale", "o_scale")


class BatchPrefillWithRaggedKVCacheWrapper(PrefillWrapper):
    """Batch prefill/append attention over ragged K/V tensors (FlashInfer's wrapper of this name)."""

    _entry = "BatchPrefillWithRaggedKVCacheWrapper"
    _storage = "ragged"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: Optional[torch.Tensor] = None, kv_indptr_buf: Optional[torch.Tensor] = None,
                 custom_mask_buf: Optional[torch.Tensor] = None, qk_indptr_buf: Optional[torch.Tensor] = UNSET,
                 backend: str = "auto", *, mask_indptr_buf: Optional[torch.Tensor] = UNSET, jit_args=None,
                 jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        """See BatchPrefillWithPagedKVCacheWrapper.__init__."""
        B.one_of("qk_indptr_buf", qk_indptr_buf, "mask_indptr_buf", mask_indptr_buf, None)
        self._init(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                   variant_owns_mask)

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
             head_dim: int = UNSET, custom_mask: Optional[torch.Tensor] = None,
             packed_custom_mask: Optional[torch.Tensor] = None, causal: bool = False, pos_encoding_mode: str = "NONE",
             allow_fp16_qk_reduction: bool = UNSET, window_left: int = -1, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             q_data_type: Union[str, torch.dtype] = "float16", kv_data_type: Union[str, torch.dtype, None] = None, *,
             head_dim_qk: int = UNSET, head_dim_vo: Optional[int] = None, use_fp16_qk_reduction: bool = UNSET,
             o_data_type=None, non_blocking: bool = True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len: int = 0, max_item_len_ptr=None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False, seq_lens: Optional[torch.Tensor] = None,
             seq_lens_q: Optional[torch.Tensor] = None, max_token_per_sequence: Optional[int] = None,
             max_sequence_kv: Optional[int] = None, v_indptr: Optional[torch.Tensor] = None,
             o_indptr: Optional[torch.Tensor] = None) -> None:
        """Validate the token indptrs (element offsets with backend='cudnn') once, decide and plan.

        qo_indptr, kv_indptr: (B+1,) int32 prefix sums, on the CPU or the device.
        """
        B.no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
        if packed_custom_mask is not None:
            custom_mask = None  # documented: "if provided, the custom_mask will be ignored"
        dim = B.required("head_dim", B.one_of("head_dim", head_dim, "head_dim_qk", head_dim_qk, UNSET), "plan")
        B.one_of("allow_fp16_qk_reduction", allow_fp16_qk_reduction, "use_fp16_qk_reduction",
                 use_fp16_qk_reduction, False)
        spec, d = B.validate_typed(RaggedPlanSpec, dict(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim_qk=dim, head_dim_vo=head_dim_vo, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            causal=causal, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
            q_data_type=q_data_type, kv_data_type=kv_data_type, o_data_type=o_data_type, seq_lens=seq_lens,
            seq_lens_q=seq_lens_q, max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv,
            v_indptr=v_indptr, o_indptr=o_indptr, backend=self._backend or "auto"))
        kv_t = torch.tensor(d.kv_indptr, dtype=torch.int32, device=self._device)
        self._finish_plan(spec, d, kv_indptr=kv_t, total_kv=d.kv_indptr[-1])

    begin_forward = plan

    def _kv_shape(self) -> tuple:
        p = self._plan
        return (p.total_kv, p.hkv)

    # the types return_lse gives (typing.overload: no runtime effect)
    @overload
    def run(self, q: torch.Tensor, *args: Any,
            return_lse: Literal[True], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def run(self, q: torch.Tensor, *args: Any, return_lse: Literal[False] = ..., **kwargs: Any) -> torch.Tensor: ...

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool = False, *, q_scale=None,
            k_scale=None, v_scale=None, o_scale=None, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None, kv_cache_sf=None,
            lse_base: str = "log2", lse_layout: str = "NH"):
        """Attention of q (total_q, Hq, Dqk) over k (total_kv, Hkv, Dqk) and v (total_kv, Hkv, Dvo):
        out = v_scale/o_scale * softmax(sm_scale*q_scale*k_scale q.k) v; (out, lse) with return_lse,
        lse fp32 base 2 (tokens, Hq), or as lse_base / lse_layout ask (see the paged wrapper's run)."""
        options = lse_base != "log2" or lse_layout != "NH"
        if options:
            self._lse_option_checks(lse_base, lse_layout, lse, q)
        if torch.compiler.is_compiling() and kv_cache_sf is None and not any(
                isinstance(s, torch.Tensor) for s in (q_scale, k_scale, v_scale, o_scale)):
            res, res_lse = ops.ragged_run(self._handle, q, k, v, return_lse or lse is not None, q_scale, k_scale,
                                           v_scale, o_scale)
            return self._compiled_result(res, res_lse, out, lse, return_lse, lse_base, lse_layout)
        if options:
            return self._with_lse_options(
                lambda buf, want: self.run(q, k, v, want, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                           o_scale=o_scale, out=out, lse=buf, kv_cache_sf=kv_cache_sf),
                lse, return_lse, lse_base, lse_layout)
        if self._plan is None:
            raise self._unplanned()
        # the run's lane on the plan's call cache (the full run checks once per call key, the size
        # checks per call, nothing on an exact repeat)
        lane = RUN.lane((q, k, v, q_scale, k_scale, v_scale, o_scale, out, lse, return_lse, kv_cache_sf, None, None),
                        self._explicit, self._calls)
        kv_sf = None if kv_cache_sf is None else nvfp4.ragged_sf(kv_cache_sf)
        return self._launch(lane, q, k, v, out, lse, return_lse, None, q_scale, k_scale, v_scale, o_scale, kv_sf)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, window_left: int = -1,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None) -> torch.Tensor:
        """Deprecated FlashInfer form of run(): its plan-time options replace the planned ones."""
        return self._forward(q, k, v, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                             rope_theta, False)

    def forward_return_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           window_left: int = -1, logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None):
        """Deprecated FlashInfer form of run_return_lse() (see forward)."""
        return self._forward(q, k, v, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                             rope_theta, True)

    def _forward(self, q, k, v, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                 rope_theta, return_lse):
        overrides, scale = self._forward_options(causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                                                 rope_scale, rope_theta)
        lane = RUN.lane((q, k, v, None, None, None, None, None, None, return_lse, None, overrides, scale),
                        self._explicit, self._calls)
        return self._launch(lane, q, k, v, None, None, return_lse, None, None, None, None, None)


B.seed_signature(BatchPrefillWithRaggedKVCacheWrapper.__init__, {"qk_indptr_buf": None})
B.seed_signature(BatchPrefillWithRaggedKVCacheWrapper.plan, {"head_dim": B.REQUIRED_SHOWN,
                                                            "allow_fp16_qk_reduction": False})


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class RaggedPlanSpec(PlanSpecBase):
    kv_indptr: torch.Tensor
    v_indptr: Optional[torch.Tensor] = None
    o_indptr: Optional[torch.Tensor] = None

    def derive(self):
        d = self.common()
        need_index("kv_indptr", self.kv_indptr, d.batch + 1, None)
        qo, kv = host_lists(self.qo_indptr, self.kv_indptr)  # one read of both
        d.qo = self.qo_host(d, qo)
        kv = check_indptr_values("kv_indptr", kv, None, "", start0=not d.cudnn)
        if d.cudnn:
            kv = self._cudnn_units(d, kv)
        d.kv_indptr = kv
        d.kv_lens = [b - a for a, b in zip(kv[:-1], kv[1:])]
        return d

    def _cudnn_units(self, d, kv):
        mult = d.hkv * d.dqk
        if any(v % mult for v in kv):
            raise bad("kv_indptr", kv, f"element offsets (multiples of num_kv_heads*head_dim_qk={mult}) with backend='cudnn'")
        kv = [v // mult for v in kv]
        for name, t, m, ref in (("v_indptr", self.v_indptr, d.hkv * d.dvo, kv),
                                ("o_indptr", self.o_indptr, d.hq * d.dvo, d.qo)):
            if t is not None:
                vals = host_ints(t)
                if len(vals) != len(ref) or [v // m for v in vals] != ref or any(v % m for v in vals):
                    raise bad(name, vals, f"element offsets of the same rows as the q/kv indptrs ({ref} x {m})")
        return kv


class RaggedRunSpec(RunSpecBase):
    k: torch.Tensor
    v: torch.Tensor
    o_scale: Optional[Scale] = None

    def derive(self):
        return SimpleNamespace()

    def static_checks(self, d):
        p = self.planned
        self.q_checks(d)
        packed = p.kv_dtype == nvfp4.PACKED  # NVFP4: head_dim // 2 bytes a row
        for name, t, dim in (("k", self.k, p.dqk // (1 + packed)), ("v", self.v, p.dvo // (1 + packed))):
            need_tensor(name, t, ranks=(3,), device=self.q.device)
            if t.dtype != p.kv_dtype:
                raise bad(f"{name}.dtype", t.dtype, f"{p.kv_dtype} (plan's kv_data_type)")
            if tuple(t.shape[1:]) != (p.hkv, dim) or t.stride(-1) != 1:
                raise bad(f"{name}.shape", tuple(t.shape), f"(n, {p.hkv}, {dim}) with a unit last stride")
        if packed:
            if self.kv_cache_sf is None:
                raise bad("kv_cache_sf", None, f"the NVFP4 scale factors of the uint8 k and v (planned with "
                          f"kv_data_type=torch.uint8): a (k_sf, v_sf) pair of {nvfp4.SF_TEXT} tensors")
            nvfp4.need_ragged_sf(self.kv_cache_sf, self.k, self.v)

    def size_checks(self, d):
        self.io_checks(d)
        for name, t in (("k", self.k), ("v", self.v)):
            if t.shape[0] < self.planned.total_kv:
                raise bad(f"{name}.shape", tuple(t.shape), f">= {self.planned.total_kv} rows (plan's kv_indptr[-1])")


RUN = B.Declaration(
    "BatchPrefillWithRaggedKVCacheWrapper.run", RaggedRunSpec,
    ("q", "k", "v", "q_scale", "k_scale", "v_scale", "o_scale", "out", "lse", "return_lse", "kv_cache_sf",
     "overrides", "sm_scale"),
    problem=run_problem, sizes=run_sizes, vary=B.NOTHING_VARIES, per_call=_RUN_PER_CALL)
