"""Small random inputs for every entry point, built as FlashInfer users build them (CPU)."""
import math

import torch

HQ, HKV, D, P = 4, 2, 16, 4


def indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13), layout="NHD", dtype=torch.float32, seed=0):
    """Random 5-D cache, random page permutation; FlashInfer page lists and a block table."""
    g = torch.Generator().manual_seed(seed)
    pages_per = [math.ceil(n / P) for n in kv_lens]
    total = sum(pages_per)
    shape = (total, 2, P, HKV, D) if layout == "NHD" else (total, 2, HKV, P, D)
    cache = torch.randn(*shape, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g).to(torch.int32)
    table = torch.zeros(len(kv_lens), max(pages_per), dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[start:start + n]
        start += n
    q = torch.randn(sum(q_lens), HQ, D, generator=g).to(dtype)
    last = torch.tensor([(n - 1) % P + 1 for n in kv_lens], dtype=torch.int32)
    return dict(q=q, cache=cache, perm=perm, table=table, kv_indptr=indptr(pages_per), last=last,
                qo=indptr(q_lens), seq=torch.tensor(kv_lens, dtype=torch.int32), q_lens=list(q_lens),
                kv_lens=list(kv_lens))


def ws():
    return torch.empty(1 << 16, dtype=torch.uint8)


def trtllm_args(c, **kw):
    args = [c["q"], c["cache"], ws(), c["table"], c["seq"], max(c["q_lens"]), max(c["kv_lens"]), D ** -0.5, 1.0,
            len(c["q_lens"]), c["qo"], c["kv_indptr"]]
    return args, dict(kv_layout="NHD", **kw)


def xqa_args(c, **kw):
    q1 = c["q"][: len(c["kv_lens"])].contiguous()
    return [q1, c["cache"], ws(), c["table"], c["seq"], max(c["kv_lens"]), D ** -0.5, 1.0], kw


def cudnn_args(c, **kw):
    k = c["cache"][:, 0].transpose(1, 2)  # (pages, Hkv, P, D) views of NHD memory
    v = c["cache"][:, 1].transpose(1, 2)
    b = len(c["q_lens"])
    base = dict(max_token_per_sequence=max(c["q_lens"]), max_sequence_kv=max(c["kv_lens"]),
                actual_seq_lens_q=torch.tensor(c["q_lens"], dtype=torch.int32).view(b, 1, 1, 1),
                actual_seq_lens_kv=c["seq"].view(b, 1, 1, 1), block_tables=c["table"], causal=True,
                return_lse=False, batch_offsets_q=c["qo"] * HQ * D, batch_offsets_o=c["qo"] * HQ * D)
    base.update(kw)
    return [c["q"], k, v, D ** -0.5, ws()], base


def paged_wrapper(c, dtype=torch.float32, **plan_kw):
    w = __import__("dispatch").BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD")
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True, q_data_type=dtype, **plan_kw)
    return w


def ragged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13), dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), HQ, D, generator=g).to(dtype)
    k = torch.randn(sum(kv_lens), HKV, D, generator=g).to(dtype)
    v = torch.randn(sum(kv_lens), HKV, D, generator=g).to(dtype)
    return dict(q=q, k=k, v=v, qo=indptr(q_lens), kv=indptr(kv_lens), q_lens=list(q_lens), kv_lens=list(kv_lens))


def ragged_wrapper(c, dtype=torch.float32, **plan_kw):
    w = __import__("dispatch").BatchPrefillWithRaggedKVCacheWrapper(ws(), "NHD")
    w.plan(c["qo"], c["kv"], HQ, HKV, D, causal=True, q_data_type=dtype, **plan_kw)
    return w


def on_device(device, value):
    """Inputs built on the CPU, moved to ``device`` (tensors inside lists, tuples and dicts too)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(on_device(device, v) for v in value)
    if isinstance(value, dict):
        return {k: on_device(device, v) for k, v in value.items()}
    return value
