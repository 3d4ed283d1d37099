"""Random inputs for an AttentionProblem: ``Case`` (the problem plus per-request lengths) and
``make_batch`` (fresh random tensors, paged caches with shuffled pages, out and LSE poisoned
with NaN). Used by ``attn-dispatch probe``, the autotune's timings and the tests; it imports
nothing of dispatch but the vocabulary (and the NVFP4 quantizer of backends/native), so any layer may
build inputs without a cycle."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from backends.native import nvfp4

from .problem import NAME_DTYPES, AttentionBatch, AttentionProblem


@dataclass(frozen=True)
class Case:
    """A named configuration: the problem plus the per-request lengths."""

    name: str
    problem: AttentionProblem
    q_lens: tuple
    kv_lens: tuple
    out_scale: float = 1.0
    tensor_scales: bool = False  # pass sm_scale / out_scale as device tensors


def _random(shape, dtype, device, gen) -> torch.Tensor:
    data = torch.randn(shape, generator=gen, dtype=torch.float32).to(device)
    return data.to(dtype)


def stored_kv(reals: torch.Tensor, kv_dtype: str) -> tuple:
    """(K or V as stored, its NVFP4 scale factors or None) of real values: kv_dtype "uint8" is NVFP4
    (fp4 values quantized in FlashInfer's format, backends/native/nvfp4.py), else a cast."""
    if kv_dtype == "uint8":
        return nvfp4.quantize(reals)
    return reals.to(NAME_DTYPES[kv_dtype]), None


def _kv(shape, kv_dtype: str, device, gen) -> tuple:
    return stored_kv(_random(shape, torch.float32, device, gen), kv_dtype)


def _paged_kv(problem, kv_lens, device, gen):
    """A shuffled page pool (logical NHD view of an NHD or HND allocation) and its table."""
    P, H = problem.page_size, problem.num_kv_heads
    pages = [max(1, math.ceil(n / P)) for n in kv_lens]
    num_pages = sum(pages) + 3
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[cursor:cursor + n].to(torch.int32)
        cursor += n
    pools = []  # (values, NVFP4 scale factors or None) of K, then of V
    for d in (problem.head_dim_qk, problem.head_dim_vo):
        if problem.kv_layout == "HND":
            stored = _kv((num_pages, H, P, d), problem.kv_dtype, device, gen)
            pools.append(tuple(x.permute(0, 2, 1, 3) if x is not None else None for x in stored))
        else:
            pools.append(_kv((num_pages, P, H, d), problem.kv_dtype, device, gen))
    return pools[0], pools[1], table.to(device)


def _indptr(lengths, device) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def random_mask(q_len: int, kv_len: int, gen: torch.Generator) -> torch.Tensor:
    """One request's (q_len, kv_len) bool mask: each key kept with probability 3/4, each query's own
    key (bottom-right: kv_len - q_len + i, the first key where that is negative) always, so no row
    is fully masked."""
    keep = torch.rand(q_len, kv_len, generator=gen) < 0.75
    keep[torch.arange(q_len), (torch.arange(q_len) + kv_len - q_len).clamp(min=0)] = True
    return keep


def _masks(case: Case, device, gen) -> dict:
    """The masks the problem declares: a custom one (``random_mask`` per request), XQA's draft bits
    of a causal draft."""
    p = case.problem
    if p.mask == "custom":
        masks = [random_mask(q_len, kv_len, gen).reshape(-1) for q_len, kv_len in zip(case.q_lens, case.kv_lens)]
        return dict(custom_mask=torch.cat(masks).to(device),
                    mask_indptr=_indptr([m.numel() for m in masks], device))
    if p.mask == "spec_bits":
        from backends.xqa import draft_mask
        return dict(spec_mask=draft_mask(_indptr(case.q_lens, "cpu"), max(case.q_lens), True, device))
    return {}


def make_batch(case: Case, device, seed: int = 0) -> AttentionBatch:
    """Fresh random inputs for a case; out and lse poisoned with NaN."""
    p, gen = case.problem, torch.Generator().manual_seed(seed)
    q_dtype = NAME_DTYPES[p.q_dtype]
    total_q, total_kv = sum(case.q_lens), sum(case.kv_lens)
    q = _random((total_q, p.num_qo_heads, p.head_dim_qk), q_dtype, device, gen)
    extra = dict(kv_indptr=None, block_table=None)
    if p.kv_storage == "paged":
        (k, k_sf), (v, v_sf), extra["block_table"] = _paged_kv(p, case.kv_lens, device, gen)
        if not p.uses_shared_paged_kv_idx:  # V's page ids of their own: the same pages through a second table
            extra["v_block_table"] = extra["block_table"].clone()
    else:
        k, k_sf = _kv((total_kv, p.num_kv_heads, p.head_dim_qk), p.kv_dtype, device, gen)
        v, v_sf = _kv((total_kv, p.num_kv_heads, p.head_dim_vo), p.kv_dtype, device, gen)
        extra["kv_indptr"] = _indptr(case.kv_lens, device)
    extra.update(k_sf=k_sf, v_sf=v_sf)
    out = torch.full((total_q, p.num_qo_heads, p.head_dim_vo), float("nan"), dtype=NAME_DTYPES[p.out_dtype], device=device)
    lse = torch.full((total_q, p.num_qo_heads), float("nan"), dtype=torch.float32, device=device) if p.return_lse else None
    sinks = torch.randn(p.num_qo_heads, generator=gen).to(device) if p.has_sinks else None
    extra.update(_masks(case, device, gen))
    sm_scale, out_scale = 1.0 / math.sqrt(p.head_dim_qk), case.out_scale
    if case.tensor_scales:
        sm_scale = torch.tensor(sm_scale, dtype=torch.float32, device=device)
        out_scale = torch.tensor([out_scale], dtype=torch.float32, device=device)
    return AttentionBatch(
        q=q, k=k, v=v, qo_indptr=_indptr(case.q_lens, device),
        kv_lens=torch.tensor(case.kv_lens, dtype=torch.int32, device=device), out=out,
        batch_size=len(case.q_lens), max_q_len=max(case.q_lens), max_kv_len=max(case.kv_lens),
        sm_scale=sm_scale, out_scale=out_scale, lse=lse, sinks=sinks, **extra)


