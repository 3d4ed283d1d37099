"""Inputs and the fp64 reference for running a backend adapter directly (plan + run), used by
tests/_fake_vendors.py (the vendor-contract tests, on the CPU) and the autotune tests; on a GPU
with the real vendor packages, ``attn-dispatch probe --backends xqa,fa2,fa3`` runs the adapters
against the same oracle.

``make_problem`` (an AttentionProblem, small defaults, any field overridden), ``make_batch``
(fresh random inputs for it: paged caches with permuted pages in the problem's physical layout,
out poisoned with NaN) and ``reference`` (fp64 out and base-2 LSE of our semantics,
dispatch/problem.py, from ``attend``: the one fp64 oracle, dispatch/benchmark/oracle.py, of one
request in a vendor's terms, window bounds and natural-log LSE).

    problem = make_problem(phase="decode", device_type="cuda")
    batch, refs = make_batch(problem, [1] * 4, [77, 300, 513, 64], device="cuda")
    ...  # backend.run(backend.plan(problem, batch), batch)
    out_ref, lse_ref = reference(problem, batch, refs)
"""
from __future__ import annotations

import math

import torch

from .oracle import LN2, attention_fp64, query_positions
from ..problem import AttentionBatch, AttentionProblem


def _cu_seqlens(lens: torch.Tensor) -> torch.Tensor:
    """(B,) lengths -> (B+1,) int32 prefix sums from 0."""
    return torch.cat([lens.new_zeros(1, dtype=torch.int64), torch.cumsum(lens.to(torch.int64), 0)]).to(torch.int32)


def attend(q, k, v, *, scale, lo=None, hi=None, soft_cap=0.0, sinks=None, alibi=None, mask=None):
    """The fp64 oracle (dispatch/benchmark/oracle.py) of one request in a vendor's terms: q (Lq,Hq,D),
    k/v (Lk,Hkv,D); query row i sits at position Lk - Lq + i; key j is visible when pos - lo <= j <=
    pos + hi (None = unbounded) and mask[i, j]. Returns out (Lq,Hq,Dv) fp64 (0 on rows with no key)
    and the natural-log LSE (Lq,Hq) (the sink's term included; -inf on rows with no key nor sink)."""
    pos = query_positions(q.shape[0], k.shape[0])[:, None]
    key = torch.arange(k.shape[0])[None, :]
    keep = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool)
    if lo is not None:
        keep &= key >= pos - lo
    if hi is not None:
        keep &= key <= pos + hi
    if mask is not None:
        keep &= mask
    out, lse = attention_fp64(q, k, v, sm_scale=scale, soft_cap=soft_cap, sinks=sinks, mask=keep,
                              alibi_slopes=alibi)
    return out, lse * LN2


def ours(problem, q, k, v, sm_scale, sinks=None, mask=None):
    """Our semantics (dispatch/problem.py) expressed in ``attend`` terms."""
    lo = problem.window_left if problem.window_left >= 0 else None
    return attend(q, k, v, scale=sm_scale, lo=lo, hi=0 if problem.causal else None,
                  soft_cap=problem.logits_soft_cap, sinks=sinks, mask=mask)


def make_problem(**kw) -> AttentionProblem:
    base = dict(entry="test", phase="prefill", kv_storage="paged", kv_layout="NHD", num_qo_heads=8,
                num_kv_heads=2, head_dim_qk=64, head_dim_vo=64, q_dtype="bfloat16", kv_dtype="bfloat16",
                out_dtype="bfloat16", page_size=16, device_type="cpu")
    base.update(kw)
    if base["kv_storage"] != "paged":
        base["page_size"] = 0
    return AttentionProblem(**base)


def make_batch(problem, q_lens, kv_lens, sm_scale=0.11, out_scale=1.0, sinks=False, lse=False, custom_mask=False,
               device="cpu", seed=0):
    """Fresh random inputs (built on the CPU, then moved to ``device``); paged caches with
    permuted pages, stored in the problem's physical layout. Returns (batch, CPU oracle inputs)."""
    gen = torch.Generator().manual_seed(seed + 7919 * len(q_lens) + sum(kv_lens))
    dt = getattr(torch, problem.q_dtype)
    hq, hkv, d = problem.num_qo_heads, problem.num_kv_heads, problem.head_dim_qk
    rnd = lambda *s: torch.randn(*s, generator=gen)
    q = rnd(sum(q_lens), hq, d).to(dt)
    qo = _cu_seqlens(torch.tensor(q_lens))
    kvl = torch.tensor(kv_lens, dtype=torch.int32)
    seqs_k = [rnd(n, hkv, d) for n in kv_lens]
    seqs_v = [rnd(n, hkv, d) for n in kv_lens]
    kv = dict(q=q, qo_indptr=qo, kv_lens=kvl, batch_size=len(q_lens), max_q_len=max(q_lens), max_kv_len=max(kv_lens))
    if problem.kv_storage == "paged":
        kv.update(_paged(problem, seqs_k, seqs_v, gen))
    else:
        kv.update(k=torch.cat(seqs_k).to(dt), v=torch.cat(seqs_v).to(dt), kv_indptr=_cu_seqlens(kvl))
    masks = None
    if custom_mask:
        masks = [torch.rand(a, b, generator=gen) < 0.7 for a, b in zip(q_lens, kv_lens)]
        for m in masks:
            m[:, -1] = True  # keep every row alive
        kv["custom_mask"] = torch.cat([m.reshape(-1) for m in masks])
    out = torch.full((sum(q_lens), hq, problem.head_dim_vo), math.nan, dtype=getattr(torch, problem.out_dtype))
    batch = AttentionBatch(out=out, sm_scale=sm_scale, out_scale=out_scale, **kv)
    if sinks:
        batch.sinks = torch.rand(hq, generator=gen) * 5
    if lse:
        batch.lse = torch.full((sum(q_lens), hq), math.nan)
    ref_k = [s.to(dt) for s in seqs_k]
    ref_v = [s.to(dt) for s in seqs_v]
    return to_device(batch, device), (ref_k, ref_v, masks)


def to_device(batch, device):
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            setattr(batch, name, value.to(device))
    return batch


def _paged(problem, seqs_k, seqs_v, gen):
    p, hkv, d = problem.page_size, problem.num_kv_heads, problem.head_dim_qk
    counts = [(len(s) + p - 1) // p for s in seqs_k]
    total = sum(counts) + 3
    perm = torch.randperm(total, generator=gen)
    table = torch.zeros(len(seqs_k), max(counts) + 1, dtype=torch.int32)  # a spare column of junk
    table[:, -1] = total - 1
    dt = getattr(torch, problem.kv_dtype)
    shape = (total, hkv, p, d) if problem.kv_layout == "HND" else (total, p, hkv, d)
    kc, vc = torch.randn(*shape, generator=gen).to(dt), torch.randn(*shape, generator=gen).to(dt)
    lk, lv = (kc.permute(0, 2, 1, 3), vc.permute(0, 2, 1, 3)) if problem.kv_layout == "HND" else (kc, vc)
    used = 0
    for b, (sk, sv) in enumerate(zip(seqs_k, seqs_v)):
        for j in range(counts[b]):
            page = int(perm[used]); used += 1
            table[b, j] = page
            lk[page, : len(sk[j * p:(j + 1) * p])] = sk[j * p:(j + 1) * p].to(dt)
            lv[page, : len(sv[j * p:(j + 1) * p])] = sv[j * p:(j + 1) * p].to(dt)
    for s, t in ((seqs_k, lk), (seqs_v, lv)):  # what the pages really hold (fp8 rounding)
        for b in range(len(s)):
            s[b] = _read_back(t, table[b], len(s[b]), p).float()
    return dict(k=lk, v=lv, block_table=table)


def _read_back(cache, row, n, p):
    return cache[row[: (n + p - 1) // p].long()].reshape(-1, *cache.shape[2:])[:n]


def reference(problem, batch, refs):
    """fp64 oracle of our semantics, out = out_scale * softmax(sm_scale q.k) v; LSE base 2."""
    ref_k, ref_v, masks = refs
    outs, lses = [], []
    qo = batch.qo_indptr.cpu()
    q, sinks = batch.q.cpu(), batch.sinks.cpu() if batch.sinks is not None else None
    for b in range(batch.batch_size):
        o, l = ours(problem, q[int(qo[b]): int(qo[b + 1])].float(), ref_k[b].float(), ref_v[b].float(),
                    float(batch.sm_scale), sinks, masks[b] if masks else None)
        outs.append(o * float(batch.out_scale))
        lses.append(l / LN2)
    return torch.cat(outs), torch.cat(lses)
