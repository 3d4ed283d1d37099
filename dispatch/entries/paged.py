"""``BatchPrefillWithPagedKVCacheWrapper`` (seed 002): batch prefill over a paged KV cache."""
from __future__ import annotations

import functools
from typing import Any, Literal, Optional, Union, overload

import torch

from .. import nvfp4, ops
from ..checks import (bad, block_table_from_pages, cache_halves, check_indptr_values, host_ints, host_lists,
                      lens_shapes, need_index, need_int, need_tensor, paged_kv_spec, paged_nhd, split_kv)
from . import _base as B
from ._base import UNSET
from ._wrapper import PlanSpecBase, PrefillWrapper, RunSpecBase, run_problem, run_sizes

_RUN_PER_CALL = ("q_scale", "k_scale", "v_scale")


class BatchPrefillWithPagedKVCacheWrapper(PrefillWrapper):
    """Batch prefill/append attention over a paged KV cache (FlashInfer's wrapper of this name).

    Plan once per batch layout (``plan``), then ``run`` once per layer; see the seed's example.
    """

    _entry = "BatchPrefillWithPagedKVCacheWrapper"
    _storage = "paged"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: Optional[torch.Tensor] = None, paged_kv_indptr_buf: Optional[torch.Tensor] = None,
                 paged_kv_indices_buf: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buf: Optional[torch.Tensor] = None,
                 custom_mask_buf: Optional[torch.Tensor] = None, qk_indptr_buf: Optional[torch.Tensor] = UNSET,
                 backend: str = "auto", *, mask_indptr_buf: Optional[torch.Tensor] = UNSET, jit_args=None,
                 jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        """float_workspace_buffer: any tensor on the inputs' device (kept, not needed by our
        backends); kv_layout: 'NHD' or 'HND'; backend: 'auto' or a backend name or alias. The
        CUDA-graph buffers are accepted; plans live in buffers of their own."""
        B.one_of("qk_indptr_buf", qk_indptr_buf, "mask_indptr_buf", mask_indptr_buf, None)
        self._init(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                   variant_owns_mask)
        # FlashInfer's graph mode replays any plan whose page ids fit the indices buffer: a request
        # may hold every page of it, so that is how far a captured graph's lengths reach by default
        if self._use_cuda_graph and isinstance(paged_kv_indices_buf, torch.Tensor):
            self._graph_pages = paged_kv_indices_buf.numel()

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int = UNSET,
             page_size: int = UNSET, custom_mask: Optional[torch.Tensor] = None,
             packed_custom_mask: Optional[torch.Tensor] = None, causal: bool = False, pos_encoding_mode: str = "NONE",
             allow_fp16_qk_reduction: bool = UNSET, sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Union[str, torch.dtype] = "float16",
             kv_data_type: Union[str, torch.dtype, None] = None, non_blocking: bool = False, *,
             head_dim_qk: int = UNSET, head_dim_vo: Optional[int] = None, use_fp16_qk_reduction: bool = UNSET,
             o_data_type=None, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None, seq_lens: Optional[torch.Tensor] = None, seq_lens_q: Optional[torch.Tensor] = None,
             block_tables: Optional[torch.Tensor] = None, max_token_per_sequence: Optional[int] = None,
             max_sequence_kv: Optional[int] = None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False) -> None:
        """Validate, convert the page lists to a block table + kv_lens once, decide and plan.

        qo_indptr (B+1,) token prefix sums (element units with backend='cudnn');
        paged_kv_indptr (B+1,) page prefix sums; paged_kv_indices page ids; paged_kv_last_page_len
        (B,) in [1, page_size]. Index tensors may be on the CPU or the device.
        """
        B.no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
        if packed_custom_mask is not None:
            custom_mask = None  # documented: "if provided, the custom_mask will be ignored"
        dim = B.required("head_dim", B.one_of("head_dim", head_dim, "head_dim_qk", head_dim_qk, UNSET), "plan")
        B.required("page_size", page_size, "plan")
        B.one_of("allow_fp16_qk_reduction", allow_fp16_qk_reduction, "use_fp16_qk_reduction",
                 use_fp16_qk_reduction, False)
        spec, d = B.validate_typed(PagedPlanSpec, dict(
            qo_indptr=qo_indptr, paged_kv_indptr=paged_kv_indptr, paged_kv_indices=paged_kv_indices,
            paged_kv_last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim_qk=dim, page_size=page_size, head_dim_vo=head_dim_vo, custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask, causal=causal, pos_encoding_mode=pos_encoding_mode,
            sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
            rope_theta=rope_theta, q_data_type=q_data_type, kv_data_type=kv_data_type, o_data_type=o_data_type,
            seq_lens=seq_lens, seq_lens_q=seq_lens_q, block_tables=block_tables,
            max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv,
            backend=self._backend or "auto"))
        # the block table: cuDNN's own; a graph's now (its capture reads it); else made when a backend
        # first reads it (FlashInfer's kernels take the page lists: a plan they serve makes none)
        table, pages = None, None
        if d.cudnn:
            table = block_tables.to(self._device)
        elif self._use_cuda_graph:
            table = block_table_from_pages(d.kv_indptr, d.page_ids, self._device)
        else:
            pages = (d.kv_indptr, d.page_ids)
        self._finish_plan(spec, d, block_table=table, pages=pages, page_size=page_size, max_page_id=d.max_page_id,
                          paged_csr=None if d.cudnn else self._page_lists(d, paged_kv_indices, paged_kv_last_page_len))

    begin_forward = plan

    def _page_lists(self, d, indices: torch.Tensor, last_page_len: torch.Tensor) -> tuple:
        """Our copies of the caller's page lists (indptr from 0 and last page lengths on the host, as
        plan() read them; the ids it covers on the device): what a FlashInfer plan reads, without
        converting the block table back."""
        start, dev = d.kv_indptr[0], self._device
        indptr = torch.tensor([n - start for n in d.kv_indptr], dtype=torch.int32)
        ids = indices.reshape(-1)[start: d.kv_indptr[-1]].to(dev, torch.int32, copy=True)
        return indptr, ids, torch.tensor(d.last_page_len, dtype=torch.int32)

    def _kv_shape(self) -> tuple:
        p = self._plan
        return (p.max_page_id + 1, p.page_size, p.hkv)

    # the types return_lse gives (typing.overload: no runtime effect)
    @overload
    def run(self, q: torch.Tensor, *args: Any,
            return_lse: Literal[True], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def run(self, q: torch.Tensor, *args: Any, return_lse: Literal[False] = ..., **kwargs: Any) -> torch.Tensor: ...

    def run(self, q: torch.Tensor, paged_kv_cache, k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            return_lse: bool = False, *, q_scale=None, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None, window_left: Optional[int] = None,
            sinks: Optional[torch.Tensor] = None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
            use_fp16_softmax=None, uses_spcompress=None, lse_base: str = "log2", lse_layout: str = "NH"):
        """Attention of q (total_q, Hq, D) over the planned paged cache: a 5-D (pages, 2, ...)
        tensor or a (k_cache, v_cache) tuple in the wrapper's layout. k_scale multiplies the
        logits, v_scale the output. Returns out, or (out, lse) with lse fp32 base 2 (tokens, Hq);
        lse_base='ln' gives it in natural log, lse_layout='HN' as its contiguous (Hq, tokens)
        transpose (a caller's lse then has that shape)."""
        options = lse_base != "log2" or lse_layout != "NH"
        if options:
            self._lse_option_checks(lse_base, lse_layout, lse, q)
        if torch.compiler.is_compiling() and kv_cache_sf is None and not any(
                isinstance(s, torch.Tensor) for s in (q_scale, k_scale, v_scale)):
            k_cache, v_cache = ops.split_kv(paged_kv_cache)
            res, res_lse = ops.paged_run(self._handle, q, k_cache, v_cache, k_scale, v_scale, return_lse or lse is not None, q_scale,
                                         window_left, sinks)
            return self._compiled_result(res, res_lse, out, lse, return_lse, lse_base, lse_layout)
        sinks = sinks if sinks is None else B.sinks_tensor(sinks, q)
        if options:
            return self._with_lse_options(
                lambda buf, want: self._run(q, paged_kv_cache, k_scale, v_scale, want, q_scale, out, buf, window_left,
                                            sinks, kv_cache_sf, None), lse, return_lse, lse_base, lse_layout)
        return self._run(q, paged_kv_cache, k_scale, v_scale, return_lse, q_scale, out, lse, window_left, sinks,
                         kv_cache_sf, None)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def _run(self, q, paged_kv_cache, k_scale, v_scale, return_lse, q_scale, out, lse, window_left, sinks,
             kv_cache_sf, overrides: Optional[tuple], sm_scale: Optional[float] = None):
        if self._plan is None:
            raise self._unplanned()
        # the run's lane on the plan's call cache (the full run checks once per call key, the size
        # checks per call, nothing on an exact repeat)
        lane = RUN.lane((q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse, window_left, sinks,
                         kv_cache_sf, overrides, sm_scale), self._explicit, self._calls)
        sizes = lane.sizes
        # a whole (pages, 2, ...) cache: its halves kept per lane (the lane key proves its facts)
        k, v = (cache_halves(paged_kv_cache, sizes.halves, lane.kept) if sizes.halves is not None
                else self._kv_views(paged_kv_cache))
        kv_sf = None if kv_cache_sf is None else nvfp4.paged_sf_views(kv_cache_sf, self._plan.layout)[:2]
        return self._launch(lane, q, k, v, out, lse, return_lse, sinks, q_scale, k_scale, v_scale, None, kv_sf)

    def _kv_views(self, paged_kv_cache) -> tuple:
        """The logical NHD views of a cache whose key already passed the checks (as the spec's)."""
        layout = "HND" if self._plan.cudnn else self._plan.layout
        if type(paged_kv_cache) is torch.Tensor and paged_kv_cache.dim() == 5 and paged_kv_cache.shape[1] == 2:
            return cache_halves(paged_kv_cache, layout)  # the common cache
        k, v, squeezed = split_kv(paged_kv_cache, "paged_kv_cache", not self._plan.cudnn)
        return paged_nhd(k, layout, squeezed), paged_nhd(v, layout, squeezed)

    def forward(self, q: torch.Tensor, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                window_left: int = -1, logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None) -> torch.Tensor:
        """Deprecated FlashInfer form of run(): its plan-time options replace the planned ones
        for this call, as FlashInfer's forward() does."""
        return self._forward(q, paged_kv_cache, causal, pos_encoding_mode, k_scale, v_scale, window_left,
                             logits_soft_cap, sm_scale, rope_scale, rope_theta, False)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           k_scale: Optional[float] = None, v_scale: Optional[float] = None, window_left: int = -1,
                           logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                           rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated FlashInfer form of run_return_lse() (see forward)."""
        return self._forward(q, paged_kv_cache, causal, pos_encoding_mode, k_scale, v_scale, window_left,
                             logits_soft_cap, sm_scale, rope_scale, rope_theta, True)

    def _forward(self, q, paged_kv_cache, causal, pos_encoding_mode, k_scale, v_scale, window_left,
                 logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse):
        overrides, scale = self._forward_options(causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                                                 rope_scale, rope_theta)
        return self._run(q, paged_kv_cache, k_scale, v_scale, return_lse, None, None, None, None, None, None,
                         overrides, scale)


B.seed_signature(BatchPrefillWithPagedKVCacheWrapper.__init__, {"qk_indptr_buf": None})
B.seed_signature(BatchPrefillWithPagedKVCacheWrapper.plan, {
    "head_dim": B.REQUIRED_SHOWN, "page_size": B.REQUIRED_SHOWN, "allow_fp16_qk_reduction": False})


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class PagedPlanSpec(PlanSpecBase):
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    page_size: int
    block_tables: Optional[torch.Tensor] = None

    def derive(self):
        d = self.common()
        need_int("page_size", self.page_size, 1)
        if d.cudnn:
            d.qo = self.qo_host(d)
            return self._cudnn_lengths(d)
        for name in ("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
            need_index(name, getattr(self, name), None, None)
        need_index("paged_kv_indptr", self.paged_kv_indptr, d.batch + 1, None)
        need_index("paged_kv_last_page_len", self.paged_kv_last_page_len, d.batch, None)
        qo, kv_indptr, last = host_lists(self.qo_indptr, self.paged_kv_indptr, self.paged_kv_last_page_len)
        d.qo = self.qo_host(d, qo)
        d.kv_indptr = check_indptr_values("paged_kv_indptr", kv_indptr, None, "", start0=False)
        # request b's pages are paged_kv_indices[indptr[b]:indptr[b+1]], at the indptr's own positions
        # (FlashInfer's page.cuh reads indices[indptr[b] + i]), also where the indptr does not start at 0
        if d.kv_indptr[-1] > self.paged_kv_indices.numel():
            raise bad("paged_kv_indices.shape", tuple(self.paged_kv_indices.shape),
                      f"at least {d.kv_indptr[-1]} page ids (paged_kv_indptr[-1])")
        counts = [b - a for a, b in zip(d.kv_indptr[:-1], d.kv_indptr[1:])]
        for b, (n, l) in enumerate(zip(counts, last)):
            if n and not 1 <= l <= self.page_size:
                raise bad(f"paged_kv_last_page_len[{b}]", l, f"in [1, page_size={self.page_size}]")
        d.kv_lens = [(n - 1) * self.page_size + l if n else 0 for n, l in zip(counts, last)]
        d.last_page_len = last
        # the ids the plan covers, read to the host once (one copy: their range and the block table)
        d.page_ids = self.paged_kv_indices.reshape(-1)[d.kv_indptr[0]: d.kv_indptr[-1]].to("cpu", torch.int32)
        low, d.max_page_id = (d.page_ids.aminmax() if d.page_ids.numel() else (0, -1))
        d.max_page_id = int(d.max_page_id)
        if int(low) < 0:
            raise bad("paged_kv_indices", int(low), "page ids >= 0")
        return d

    def _cudnn_lengths(self, d):
        """backend='cudnn': lengths and pages come from seq_lens / seq_lens_q / block_tables."""
        for name in ("seq_lens", "seq_lens_q", "block_tables"):
            if getattr(self, name) is None:
                raise bad(name, None, "a tensor (required by plan with backend='cudnn')")
        need_index("seq_lens", self.seq_lens, d.batch, None, lens_shapes(d.batch))
        need_index("seq_lens_q", self.seq_lens_q, d.batch, None, lens_shapes(d.batch))
        need_index("block_tables", self.block_tables, None, None)
        need_tensor("block_tables", self.block_tables, ranks=(2,))
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        if host_ints(self.seq_lens_q) != q_lens:
            raise bad("seq_lens_q", host_ints(self.seq_lens_q), f"the lengths of qo_indptr: {q_lens}")
        d.kv_lens = host_ints(self.seq_lens)
        capacity = self.block_tables.shape[1] * self.page_size
        if any(not 0 <= n <= capacity for n in d.kv_lens):
            raise bad("seq_lens", d.kv_lens, f"lengths in [0, {capacity}] = block_tables.shape[1] * page_size")
        ids = self.block_tables.to("cpu", torch.int64)
        used = torch.arange(ids.shape[1]).unsqueeze(0) < ((torch.tensor(d.kv_lens) + self.page_size - 1)
                                                         // self.page_size).unsqueeze(1)
        d.max_page_id = int(ids[used].max()) if used.any() else -1
        if used.any() and int(ids[used].min()) < 0:
            raise bad("block_tables", int(ids[used].min()), "page ids >= 0")
        return d


class PagedRunSpec(RunSpecBase):
    paged_kv_cache: Any
    window_left: Optional[int] = None

    def derive(self):
        p = self.planned
        if p.cudnn:  # cuDNN reads (pages, Hkv, P, D) whatever the wrapper's kv_layout
            return paged_kv_spec(self.paged_kv_cache, "HND", allow_squeezed=False, name="paged_kv_cache")
        d = paged_kv_spec(self.paged_kv_cache, p.layout, allow_squeezed=True, name="paged_kv_cache")
        if d.kv_dtype == nvfp4.PACKED:  # NVFP4: head_dim // 2 bytes a row
            d.dqk, d.dvo = d.dqk * 2, d.dvo * 2
        return d

    def static_checks(self, d):
        p = self.planned
        self.q_checks(d)
        if d.k.device != self.q.device:
            raise bad("paged_kv_cache.device", d.k.device, f"{self.q.device}, the device of q")
        if d.kv_dtype != p.kv_dtype:
            raise bad("paged_kv_cache.dtype", d.kv_dtype, f"{p.kv_dtype} (plan's kv_data_type)")
        if p.kv_dtype == nvfp4.PACKED:
            if self.kv_cache_sf is None:
                raise bad("kv_cache_sf", None, f"the NVFP4 scale factors of the uint8 paged_kv_cache (planned with "
                          f"kv_data_type=torch.uint8): {nvfp4.SF_TEXT} tensors like the cache's halves")
            nvfp4.need_paged_sf(self.kv_cache_sf, d)
        got = (d.page_size, d.hkv, d.dqk, d.dvo)
        if got != (p.page_size, p.hkv, p.dqk, p.dvo):
            cache = self.paged_kv_cache
            shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else tuple(tuple(t.shape) for t in cache)
            raise bad("paged_kv_cache.shape", shape, f"(page_size, num_kv_heads, head_dim_qk, head_dim_vo) = "
                      f"{(p.page_size, p.hkv, p.dqk, p.dvo)} as planned, in the {p.layout} layout (got {got} "
                      f"from K/V of shape {tuple(d.k.shape)} as (pages, page_size, heads, dim))")
        if self.window_left is not None and self.window_left != p.window_left and p.backend != "trtllm-gen":
            raise bad("window_left", self.window_left, f"None or {p.window_left} (the planned value)")

    def size_checks(self, d):
        self.io_checks(d)
        if self.planned.max_page_id >= d.pages:
            name = "block_tables" if self.planned.cudnn else "paged_kv_indices"
            raise bad(f"{name} (planned)", self.planned.max_page_id, f"page ids < {d.pages}, the pages of "
                      f"paged_kv_cache (shape[0]={d.pages}): re-plan, or pass the whole cache")


def paged_run_sizes(args: dict, d):
    """``run_sizes`` and the layout of a whole (pages, 2, ...) cache's halves (None: a (k, v) pair or
    a squeezed cache); the lane key (the cache's type and shape) proves it for every repeat."""
    sizes, cache, p = run_sizes(args, d), args["paged_kv_cache"], args["planned"]
    whole = type(cache) is torch.Tensor and cache.dim() == 5 and cache.shape[1] == 2
    sizes.halves = ("HND" if p.cudnn else p.layout) if whole else None
    return sizes


RUN = B.Declaration(
    "BatchPrefillWithPagedKVCacheWrapper.run", PagedRunSpec,
    ("q", "paged_kv_cache", "q_scale", "k_scale", "v_scale", "out", "lse", "return_lse", "window_left", "sinks",
     "kv_cache_sf", "overrides", "sm_scale"),
    problem=run_problem, sizes=paged_run_sizes, vary=B.NOTHING_VARIES, per_call=_RUN_PER_CALL)
