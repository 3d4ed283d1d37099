"""FlashInfer's test_cudnn_prefill.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

The paged wrapper with ``backend="cudnn"`` (q offsets in elements, ``seq_lens``/``seq_lens_q``,
``block_tables``, cuDNN's maxima) against the fp64 oracle with FlashInfer's tolerance (atol 3e-3,
rtol 1e-2): on a GPU; on the CPU the cuDNN wrapper is refused by device, and the same cases run
through ``cudnn_batch_prefill_with_kv_cache`` (the reference serves it) and through the wrapper
with auto and token offsets. The fp8 case (q, K, V in e4m3 with tensor scales) runs the same way
at FlashInfer's 1e-2.
"""
import pytest
import torch

import dispatch
from _fi_semantics import cudnn_paged_case, grid, per_request, sample, workspace

HEAD_DIM = 128
CASES = [(b, sq, skv, p, hkv, c, lse) for b in (1, 4) for sq in (8, 17) for skv in (8, 32) for p in (8, 16, 64)
         for hkv in (1, 4) for c in (True, False) for lse in (True, False) if sq <= skv]
CPU_CASES = sample(CASES, 12)
GPU_CASES = [(4, 700, 1066, 16, 4, True, True), (1, 17, 1066, 64, 1, False, False), (4, 8, 32, 8, 1, True, True)]
FIELDS = "batch_size, s_qo, s_kv, page_size, num_kv_heads, causal, return_lse"


def cudnn_wrapper_call(c, device, causal, s_qo, s_kv, page_size, num_kv_heads, q_dtype=torch.bfloat16, **run_kw):
    hq = c["q"].shape[1]
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend="cudnn")

    def call():
        wrapper.plan(c["qo_indptr"] * HEAD_DIM * hq, c["kv_indptr"], c["kv_indices"], c["last"], hq, num_kv_heads,
                     HEAD_DIM, page_size, pos_encoding_mode="NONE", causal=causal, q_data_type=q_dtype,
                     seq_lens=c["seq_kv"].view(-1, 1, 1, 1).to(device),
                     seq_lens_q=c["seq_q"].view(-1, 1, 1, 1).to(device),
                     sm_scale=HEAD_DIM ** -0.5, max_token_per_sequence=s_qo, max_sequence_kv=s_kv,
                     block_tables=c["block_tables"])
        return wrapper.run(c["q"], (c["k_cache"], c["v_cache"]), **run_kw)
    return call


@grid(FIELDS, CPU_CASES, GPU_CASES, named="cudnn")
def test_cudnn_prefill(device, backend, batch_size, s_qo, s_kv, page_size, num_kv_heads, causal, return_lse):
    c = cudnn_paged_case(batch_size, s_qo, s_kv, page_size, num_kv_heads, 4, HEAD_DIM, device)
    q_lens = c["seq_q"].tolist()
    call = cudnn_wrapper_call(c, device, causal, s_qo, s_kv, page_size, num_kv_heads)
    if device == "cpu":
        with pytest.raises(dispatch.BackendRefusedError, match=r"device_kind='cpu': allowed one of 'cuda'"):
            call()
    elif backend == "cudnn":
        per_request(call(), c["q"], q_lens, c["ks"], c["vs"], rtol=1e-2, atol=3e-3, causal=causal)
    # the same problem through the cuDNN function and the wrapper in FlashInfer's token units
    out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(
        c["q"], c["k_cache"], c["v_cache"], HEAD_DIM ** -0.5, workspace(device), max_token_per_sequence=s_qo,
        max_sequence_kv=s_kv, actual_seq_lens_q=c["seq_q"].view(-1, 1, 1, 1),
        actual_seq_lens_kv=c["seq_kv"].view(-1, 1, 1, 1), block_tables=c["block_tables"], causal=causal,
        return_lse=return_lse, batch_offsets_q=c["qo_indptr"].to(device) * 4 * HEAD_DIM,
        batch_offsets_o=c["qo_indptr"].to(device) * 4 * HEAD_DIM,
        backend=None if backend == "auto" else backend)
    per_request(out, c["q"], q_lens, c["ks"], c["vs"], rtol=1e-2, atol=3e-3, causal=causal)
    if return_lse:  # cuDNN's padded (batch, max_token_per_sequence, Hq) layout, base 2
        rows = torch.cat([lse[b, :n] for b, n in enumerate(q_lens)])
        per_request(out, c["q"], q_lens, c["ks"], c["vs"], rtol=1e-2, atol=3e-3, lse=rows, causal=causal)
    # token units are FlashInfer's convention for every wrapper backend but cuDNN (element offsets, above)
    token_backend = "auto" if backend == "cudnn" else backend
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "HND", backend=token_backend)
    wrapper.plan(c["qo_indptr"], c["kv_indptr"], c["kv_indices"], c["last"], 4, num_kv_heads, HEAD_DIM, page_size,
                 causal=causal, q_data_type=torch.bfloat16)
    per_request(wrapper.run(c["q"], (c["k_cache"], c["v_cache"])), c["q"], q_lens, c["ks"], c["vs"], rtol=1e-2,
                atol=3e-3, causal=causal)


FP8_CPU = sample(CASES, 4, seed=1)


@grid(FIELDS, FP8_CPU, GPU_CASES[:2], named="cudnn")
def test_cudnn_prefill_fp8(device, backend, batch_size, s_qo, s_kv, page_size, num_kv_heads, causal, return_lse):
    """q, K and V in fp8 e4m3 (each scaled by amax / 256), the scales as fp32 tensors at run()."""
    c = cudnn_paged_case(batch_size, s_qo, s_kv, page_size, num_kv_heads, 4, HEAD_DIM, device)
    q_scale = c["q"].float().abs().amax() / 256
    k_scale = torch.stack([k.float().abs().amax() for k in c["ks"]]).amax() / 256
    v_scale = torch.stack([v.float().abs().amax() for v in c["vs"]]).amax() / 256
    q8 = (c["q"].float() / q_scale).to(torch.float8_e4m3fn)
    k8 = (c["k_cache"].float() / k_scale).to(torch.float8_e4m3fn)
    v8 = (c["v_cache"].float() / v_scale).to(torch.float8_e4m3fn)
    seen_q = q8.double() * q_scale.double()
    table = c["block_tables"].cpu().long()
    ks = [(k8.transpose(1, 2)[table[b]].flatten(0, 1)[:n].double() * k_scale.double()) for b, n in
          enumerate(c["seq_kv"].tolist())]
    vs = [(v8.transpose(1, 2)[table[b]].flatten(0, 1)[:n].double() * v_scale.double()) for b, n in
          enumerate(c["seq_kv"].tolist())]
    q_lens = c["seq_q"].tolist()
    c8 = dict(c, q=q8, k_cache=k8, v_cache=v8)
    call = cudnn_wrapper_call(c8, device, causal, s_qo, s_kv, page_size, num_kv_heads, q_dtype=torch.float8_e4m3fn,
                              q_scale=q_scale.to(device), k_scale=k_scale.to(device), v_scale=v_scale.to(device))
    # the cuDNN wrapper refuses: on the CPU by device; on a GPU because our cuDNN graph has no fp8 node
    # (FlashInfer's own test expects a failure on Blackwell and skips elsewhere)
    refused = r"device_kind='cpu': allowed one of 'cuda'" if device == "cpu" else r"q_dtype='float8_e4m3fn': allowed"
    with pytest.raises(dispatch.BackendRefusedError, match=refused):
        call()
    if backend == "cudnn":
        return  # the named backend's answer is its refusal
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "HND", backend=backend)
    wrapper.plan(c["qo_indptr"], c["kv_indptr"], c["kv_indices"], c["last"], 4, num_kv_heads, HEAD_DIM, page_size,
                 causal=causal, q_data_type=torch.float8_e4m3fn, kv_data_type=torch.float8_e4m3fn,
                 o_data_type=torch.bfloat16)
    call = lambda: wrapper.run(q8, (k8, v8), q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)  # noqa: E731
    per_request(call(), seen_q, q_lens, ks, vs, rtol=1e-2, atol=1e-2, causal=causal)
