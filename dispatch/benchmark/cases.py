"""Small inputs for every entry point, built as FlashInfer users build them: any device, any dtype.

Shared by ``attn-dispatch bench`` (its host-cost runs too) and the scripts under tools/,
so that none of them imports tests/ (the tests keep their own CPU builders in tests/_api_cases.py).

A case is a plain dict (the tensors an entry point takes, plus its sizes), made by
``paged`` (a random 5-D page cache in NHD or HND, pages in a random order, FlashInfer's page
lists and a block table) or ``ragged`` (packed q/k/v); the ``*_args`` helpers turn a paged
case into the positional and keyword arguments of one entry point, the ``*_wrapper`` helpers
return a planned FlashInfer-style wrapper.

    c = paged(device="cuda", dtype=torch.bfloat16)
    args, kw = trtllm_args(c)
    dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..wrappers import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

HQ, HKV, D, P = 4, 2, 16, 4  # default sizes: query heads, KV heads, head dim, page size
CUDA_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's examples use 128 MiB
CPU_WORKSPACE_BYTES = 1 << 16


def indptr(lens: Sequence[int], device: Any = "cpu") -> torch.Tensor:
    """int32 prefix sums (len(lens) + 1,): FlashInfer's indptr arrays."""
    return torch.tensor([0, *torch.tensor(list(lens), dtype=torch.int64).cumsum(0).tolist()],
                        dtype=torch.int32, device=device)


def _randn(shape, dtype: torch.dtype, device: Any, gen: torch.Generator) -> torch.Tensor:
    # drawn in fp32 (fp8 has no randn), then cast: the same values for every dtype of one seed
    return torch.randn(*shape, generator=gen, device=gen.device).to(device=device, dtype=dtype)


def _generator(device: Any, seed: int) -> torch.Generator:
    device = torch.device(device)
    return torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)


def paged(q_lens: Sequence[int] = (3, 1, 5), kv_lens: Sequence[int] = (9, 4, 13), layout: str = "NHD",
          dtype: torch.dtype = torch.float32, seed: int = 0, device: Any = "cpu", *, num_qo_heads: int = HQ,
          num_kv_heads: int = HKV, head_dim: int = D, page_size: int = P,
          kv_dtype: torch.dtype | None = None) -> dict:
    """A random paged case: 5-D cache (pages, 2, P, Hkv, D) for NHD or (pages, 2, Hkv, P, D) for
    HND, pages in a random order; ``perm`` (page ids in request order), ``kv_indptr`` and
    ``last`` (FlashInfer's page lists), ``table`` (block table), ``qo`` and ``seq`` (kv lengths)."""
    gen = _generator(device, seed)
    pages_per = [math.ceil(n / page_size) for n in kv_lens]
    total = sum(pages_per)
    shape = ((total, 2, page_size, num_kv_heads, head_dim) if layout == "NHD"
             else (total, 2, num_kv_heads, page_size, head_dim))
    cache = _randn(shape, kv_dtype or dtype, device, gen)
    perm = torch.randperm(total, generator=gen, device=gen.device).to(device=device, dtype=torch.int32)
    table = torch.zeros(len(kv_lens), max(pages_per), dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[start:start + n]
        start += n
    q = _randn((sum(q_lens), num_qo_heads, head_dim), dtype, device, gen)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32, device=device)
    return dict(q=q, cache=cache, perm=perm, table=table, kv_indptr=indptr(pages_per, device), last=last,
                qo=indptr(q_lens, device), seq=torch.tensor(list(kv_lens), dtype=torch.int32, device=device),
                q_lens=list(q_lens), kv_lens=list(kv_lens), layout=layout, dtype=dtype, device=torch.device(device),
                num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size)


def ragged(q_lens: Sequence[int] = (3, 1, 5), kv_lens: Sequence[int] = (9, 4, 13),
           dtype: torch.dtype = torch.float32, seed: int = 1, device: Any = "cpu", *, num_qo_heads: int = HQ,
           num_kv_heads: int = HKV, head_dim: int = D) -> dict:
    """A random ragged case: packed q (total_q, Hq, D), k and v (total_kv, Hkv, D), ``qo`` and ``kv`` indptrs."""
    gen = _generator(device, seed)
    q = _randn((sum(q_lens), num_qo_heads, head_dim), dtype, device, gen)
    k = _randn((sum(kv_lens), num_kv_heads, head_dim), dtype, device, gen)
    v = _randn((sum(kv_lens), num_kv_heads, head_dim), dtype, device, gen)
    return dict(q=q, k=k, v=v, qo=indptr(q_lens, device), kv=indptr(kv_lens, device), q_lens=list(q_lens),
                kv_lens=list(kv_lens), dtype=dtype, device=torch.device(device),
                num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)


def ws(device: Any = "cpu", nbytes: int | None = None) -> torch.Tensor:
    """A uint8 workspace buffer: 128 MiB on a GPU (what the vendors' examples use), 64 KiB on the CPU."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = CUDA_WORKSPACE_BYTES if device.type == "cuda" else CPU_WORKSPACE_BYTES
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def _sm_scale(c: dict) -> float:
    return c["head_dim"] ** -0.5


def trtllm_args(c: dict, **kw) -> tuple[list, dict]:
    """``trtllm_batch_context_with_kv_cache`` arguments for a paged case."""
    args = [c["q"], c["cache"], ws(c["device"]), c["table"], c["seq"], max(c["q_lens"]), max(c["kv_lens"]),
            _sm_scale(c), 1.0, len(c["q_lens"]), c["qo"], c["kv_indptr"]]
    return args, dict(kv_layout=c["layout"], **kw)


def xqa_args(c: dict, **kw) -> tuple[list, dict]:
    """``xqa_batch_decode_with_kv_cache`` arguments: one query token per request of a paged case."""
    q1 = c["q"][: len(c["kv_lens"])].contiguous()
    args = [q1, c["cache"], ws(c["device"]), c["table"], c["seq"], max(c["kv_lens"]), _sm_scale(c), 1.0]
    return args, ({"kv_layout": c["layout"], **kw} if c["layout"] != "NHD" else kw)


def cudnn_args(c: dict, **kw) -> tuple[list, dict]:
    """``cudnn_batch_prefill_with_kv_cache`` arguments: K/V as (pages, Hkv, P, D) views of the cache."""
    k, v = c["cache"][:, 0], c["cache"][:, 1]
    if c["layout"] == "NHD":  # (pages, P, Hkv, D) memory seen as (pages, Hkv, P, D): a view, no copy
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    b = len(c["q_lens"])
    row = c["num_qo_heads"] * c["head_dim"]
    base = dict(max_token_per_sequence=max(c["q_lens"]), max_sequence_kv=max(c["kv_lens"]),
                actual_seq_lens_q=torch.tensor(c["q_lens"], dtype=torch.int32, device=c["device"]).view(b, 1, 1, 1),
                actual_seq_lens_kv=c["seq"].view(b, 1, 1, 1), block_tables=c["table"], causal=True,
                return_lse=False, batch_offsets_q=c["qo"] * row, batch_offsets_o=c["qo"] * row)
    base.update(kw)
    return [c["q"], k, v, _sm_scale(c), ws(c["device"])], base


def paged_wrapper(c: dict, cls: Any = None, **plan_kw):
    """A ``BatchPrefillWithPagedKVCacheWrapper`` planned for a paged case (causal unless told);
    ``cls``: another implementation of the class (FlashInfer's own, for a side-by-side run)."""
    w = (cls or BatchPrefillWithPagedKVCacheWrapper)(ws(c["device"]), c["layout"])
    kw = dict(causal=True, q_data_type=c["dtype"], kv_data_type=c["cache"].dtype)
    kw.update(plan_kw)
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], c["num_qo_heads"], c["num_kv_heads"], c["head_dim"],
           c["page_size"], **kw)
    return w


def ragged_wrapper(c: dict, cls: Any = None, **plan_kw):
    """A ``BatchPrefillWithRaggedKVCacheWrapper`` planned for a ragged case (causal unless told);
    ``cls`` as for ``paged_wrapper``."""
    w = (cls or BatchPrefillWithRaggedKVCacheWrapper)(ws(c["device"]), "NHD")
    kw = dict(causal=True, q_data_type=c["dtype"], kv_data_type=c["k"].dtype)
    kw.update(plan_kw)
    w.plan(c["qo"], c["kv"], c["num_qo_heads"], c["num_kv_heads"], c["head_dim"], **kw)
    return w
