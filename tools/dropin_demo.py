"""The main job on the CPU default: every entry point, called as FlashInfer users call it.

Each call runs through `import dispatch` on whatever this machine offers (the PyTorch
reference on a CPU), is checked against float64 `scaled_dot_product_attention`, and the
table says which backend served it. Exit status 1 if any result disagrees.

    python -m tools.dropin_demo [--device cuda]
"""
from __future__ import annotations

import argparse
import math
import sys

# dispatch before torch: without NumPy (not a dependency) importing torch warns "Failed to initialize
# NumPy", and dispatch imports torch with exactly that warning silenced
import dispatch  # noqa: I001

import torch
import torch.nn.functional as F

HQ, HKV, D, PAGE = 8, 2, 64, 16


def sdpa64(q, k, v, causal):
    """float64 reference for one request: (Sq, Hq, D) x (Skv, Hkv, D); bottom-right causal."""
    group = q.shape[1] // k.shape[1]
    qt = q.double().transpose(0, 1)
    kt = k.double().repeat_interleave(group, dim=1).transpose(0, 1)
    vt = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    mask = None
    if causal:
        sq, skv = q.shape[0], k.shape[0]
        mask = torch.ones(sq, skv, dtype=torch.bool).tril(diagonal=skv - sq)
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(0, 1)


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def paged_case(dev, dtype, q_lens, kv_lens):
    """Random paged cache (NHD 5-D), random page permutation, block table and FlashInfer indices."""
    pages_per = [math.ceil(n / PAGE) for n in kv_lens]
    total = sum(pages_per)
    cache = torch.randn(total, 2, PAGE, HKV, D, dtype=dtype, device=dev)
    perm = torch.randperm(total, device=dev).to(torch.int32)
    table = torch.zeros(len(kv_lens), max(pages_per), dtype=torch.int32, device=dev)
    start, ks, vs = 0, [], []
    for b, n in enumerate(pages_per):
        ids = perm[start:start + n]
        table[b, :n] = ids
        ks.append(cache[ids.long(), 0].reshape(-1, HKV, D)[:kv_lens[b]])
        vs.append(cache[ids.long(), 1].reshape(-1, HKV, D)[:kv_lens[b]])
        start += n
    q = torch.randn(sum(q_lens), HQ, D, dtype=dtype, device=dev)
    return q, cache, perm, table, ks, vs


def indptr(lens, dev):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)


def expected(q, ks, vs, q_lens, causal):
    outs, start = [], 0
    for b, n in enumerate(q_lens):
        outs.append(sdpa64(q[start:start + n].cpu(), ks[b].cpu(), vs[b].cpu(), causal))
        start += n
    return torch.cat(outs)


def run_all(dev):
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    q_lens, kv_lens = [5, 1, 9], [33, 17, 40]
    q, cache, perm, table, ks, vs = paged_case(dev, dtype, q_lens, kv_lens)
    ref = expected(q, ks, vs, q_lens, causal=True)
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=dev)
    qo, seq = indptr(q_lens, dev), torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    results = []

    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    pages_per = [math.ceil(n / PAGE) for n in kv_lens]
    last = torch.tensor([(n - 1) % PAGE + 1 for n in kv_lens], dtype=torch.int32, device=dev)
    wrapper.plan(qo, indptr(pages_per, dev), perm, last, HQ, HKV, D, PAGE, causal=True, q_data_type=dtype)
    results.append(("BatchPrefillWithPagedKVCacheWrapper", wrapper.run(q, cache), ref, wrapper.decision.chosen))

    out = dispatch.trtllm_batch_context_with_kv_cache(
        q, cache.transpose(2, 3), ws, table, seq, max(q_lens), max(kv_lens), D ** -0.5, 1.0,
        len(q_lens), qo, indptr(pages_per, dev))
    results.append(("trtllm_batch_context_with_kv_cache", out, ref, _served(dispatch.trtllm_batch_context_with_kv_cache)))

    k_hnd, v_hnd = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)  # (pages, Hkv, P, D) views
    lens4 = lambda x: x.view(-1, 1, 1, 1)  # noqa: E731 - cuDNN's (B,1,1,1) lengths
    out, _ = dispatch.cudnn_batch_prefill_with_kv_cache(
        q, k_hnd, v_hnd, D ** -0.5, ws, max_token_per_sequence=max(q_lens), max_sequence_kv=max(kv_lens),
        actual_seq_lens_q=lens4(torch.tensor(q_lens, dtype=torch.int32, device=dev)),
        actual_seq_lens_kv=lens4(seq), block_tables=table, causal=True, return_lse=False,
        batch_offsets_q=qo * HQ * D, batch_offsets_o=qo * HQ * D)
    results.append(("cudnn_batch_prefill_with_kv_cache", out, ref, _served(dispatch.cudnn_batch_prefill_with_kv_cache)))

    q1 = torch.randn(len(kv_lens), HQ, D, dtype=dtype, device=dev)
    ref1 = torch.cat([sdpa64(q1[b:b + 1].cpu(), ks[b].cpu(), vs[b].cpu(), True) for b in range(len(kv_lens))])
    out = dispatch.xqa_batch_decode_with_kv_cache(q1, cache, ws, table, seq, max(kv_lens), D ** -0.5, 1.0)
    results.append(("xqa_batch_decode_with_kv_cache", out, ref1, _served(dispatch.xqa_batch_decode_with_kv_cache)))

    kr, vr = torch.cat(ks), torch.cat(vs)
    ragged = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    ragged.plan(qo, indptr(kv_lens, dev), HQ, HKV, D, causal=True, q_data_type=dtype)
    results.append(("BatchPrefillWithRaggedKVCacheWrapper", ragged.run(q, kr, vr), ref, ragged.decision.chosen))

    n = q_lens[2]
    qs = q[q_lens[0] + q_lens[1]:]
    out, lse = dispatch.single_prefill_with_kv_cache_return_lse(qs, ks[2], vs[2], causal=True)
    results.append(("single_prefill_with_kv_cache_return_lse", out, ref[-n:], _served(dispatch.single_prefill_with_kv_cache)))
    out = dispatch.single_prefill_with_kv_cache(qs, ks[2], vs[2], causal=True)
    results.append(("single_prefill_with_kv_cache", out, ref[-n:], _served(dispatch.single_prefill_with_kv_cache)))
    return results


def _served(entry) -> str:
    """The backend the last call of this entry point was served by (from its cached decision)."""
    last = dispatch.last_decision()
    return last.chosen if last is not None else "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = run_all(args.device)
    tol = 2e-2 if args.device == "cuda" else 1e-5
    print(f"{'entry point':45s} {'backend':14s} {'rel. error vs fp64':>18s}")
    bad = 0
    for name, out, ref, backend in rows:
        err = rel_err(out, ref)
        bad += not err < tol
        print(f"{name:45s} {backend:14s} {err:18.2e}{'' if err < tol else '  FAIL'}")
    print(f"{len(rows) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
