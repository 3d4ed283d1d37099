"""Bad inputs are refused before any kernel runs: the right exception type, a message naming
the argument and the offending value, and caller buffers (out / lse, poisoned with a sentinel)
left untouched. One case per kind of mistake, across all seven entry points."""
import pytest
import torch

import dispatch
from _api_cases import (D, HKV, HQ, P, cudnn_args, paged, paged_wrapper, ragged, ragged_wrapper, trtllm_args,
                        xqa_args, ws)

SENTINEL = 12345.0
TOTAL_Q = 9  # tokens of the default paged/ragged case


def bufs():
    return (torch.full((TOTAL_Q, HQ, D), SENTINEL), torch.full((TOTAL_Q, HQ), SENTINEL))


def trtllm(out, lse, mutate=None, **kw):
    c = paged()
    args, base = trtllm_args(c, out=out, lse=lse)
    base.update(kw)
    if mutate:
        mutate(c, args, base)
    dispatch.trtllm_batch_context_with_kv_cache(*args, **base)


def xqa(out, lse, mutate=None, **kw):
    c = paged()
    args, base = xqa_args(c, out=out[:3], **kw)
    if mutate:
        mutate(c, args, base)
    dispatch.xqa_batch_decode_with_kv_cache(*args, **base)


def cudnn(out, lse, mutate=None, **kw):
    c = paged()
    args, base = cudnn_args(c, out=out, **kw)
    if mutate:
        mutate(c, args, base)
    dispatch.cudnn_batch_prefill_with_kv_cache(*args, **base)


def paged_run(out, lse, mutate=None, plan_kw=None, **kw):
    c = paged()
    w = paged_wrapper(c, **(plan_kw or {}))
    args = [c["q"], c["cache"]]
    if mutate:
        mutate(c, args, kw)
    w.run(*args, out=out, lse=lse, **kw)


def paged_plan(out, lse, mutate=None, **kw):
    c = paged()
    if mutate:
        mutate(c, None, kw)
    paged_wrapper(c, **kw)


def ragged_run(out, lse, mutate=None, **kw):
    c = ragged()
    w = ragged_wrapper(c)
    args = [c["q"], c["k"], c["v"]]
    if mutate:
        mutate(c, args, kw)
    w.run(*args, out=out, lse=lse, **kw)


def single(out, lse, mutate=None, **kw):
    c = ragged(q_lens=(4,), kv_lens=(7,))
    args = [c["q"], c["k"], c["v"]]
    if mutate:
        mutate(c, args, kw)
    dispatch.single_prefill_with_kv_cache(*args, **kw)


def setarg(i, fn):
    def mutate(c, args, kw):
        args[i] = fn(c, args[i])
    return mutate


def setkw(name, fn):
    def mutate(c, args, kw):
        kw[name] = fn(c, kw.get(name))
    return mutate


def bad_last_page(c, args, kw):
    c["last"][0] = P + 3


META = torch.device("meta")
CASES = [
    # (id, caller, kwargs, exception, substrings the message must contain)
    ("trtllm-layout", trtllm, dict(kv_layout="NCHW"), ValueError, ["kv_layout", "'NCHW'", "'NHD' or 'HND'"]),
    ("trtllm-q-rank", trtllm, dict(mutate=setarg(0, lambda c, q: q.reshape(9, -1))), ValueError, ["query", "(9, 64)"]),
    ("trtllm-q-dtype", trtllm, dict(mutate=setarg(0, lambda c, q: q.to(torch.int32))), ValueError, ["query.dtype", "int32"]),
    ("trtllm-kv-dtype", trtllm, dict(mutate=setarg(1, lambda c, kv: kv.half())), ValueError, ["kv_cache.dtype", "float16"]),
    ("trtllm-gqa", trtllm, dict(mutate=setarg(0, lambda c, q: q[:, :3])), ValueError, ["num_qo_heads", "3"]),
    ("trtllm-table-dtype", trtllm, dict(mutate=setarg(3, lambda c, t: t.long())), ValueError, ["block_tables.dtype", "int64"]),
    ("trtllm-table-rows", trtllm, dict(mutate=setarg(3, lambda c, t: t[:2])), ValueError, ["block_tables.shape", "(2, 4)"]),
    ("trtllm-table-device", trtllm, dict(mutate=setarg(3, lambda c, t: t.to(META))), ValueError, ["block_tables.device", "meta"]),
    ("trtllm-seq-capacity", trtllm, dict(mutate=lambda c, a, kw: (setarg(4, lambda c, s: s + torch.tensor([0, 0, 40], dtype=torch.int32))(c, a, kw),
                                                       setarg(6, lambda c, x: 99)(c, a, kw))), ValueError, ["seq_lens", "53"]),
    ("trtllm-page-id", trtllm, dict(mutate=setarg(3, lambda c, t: t.index_fill(1, torch.tensor([0]), 77))), ValueError,
     ["block_tables", "77"]),
    ("trtllm-cumq-order", trtllm, dict(mutate=setarg(10, lambda c, x: torch.tensor([0, 5, 4, 9], dtype=torch.int32))),
     ValueError, ["cum_seq_lens_q", "4"]),
    ("trtllm-cumq-end", trtllm, dict(mutate=setarg(10, lambda c, x: torch.tensor([0, 3, 4, 8], dtype=torch.int32))),
     ValueError, ["cum_seq_lens_q[-1]", "8"]),
    ("trtllm-max-q", trtllm, dict(mutate=setarg(5, lambda c, x: 2)), ValueError, ["max_q_len", "2"]),
    ("trtllm-bmm1-inf", trtllm, dict(mutate=setarg(7, lambda c, x: float("inf"))), ValueError, ["bmm1_scale", "inf"]),
    ("trtllm-bmm1-type", trtllm, dict(mutate=setarg(7, lambda c, x: "0.25")), TypeError, ["bmm1_scale", "'0.25'"]),
    ("trtllm-out-shape", trtllm, dict(mutate=setkw("out", lambda c, o: o[:, :, :8])), ValueError, ["out.shape", "(9, 4, 8)"]),
    ("trtllm-lse-dtype", trtllm, dict(mutate=setkw("lse", lambda c, x: torch.zeros(9, HQ, dtype=torch.float16))),
     ValueError, ["lse.dtype", "float16"]),
    ("trtllm-sinks-shape", trtllm, dict(sinks=torch.zeros(3)), ValueError, ["sinks.shape", "(3,)"]),
    ("trtllm-window", trtllm, dict(window_left=-2), ValueError, ["window_left", "-2"]),
    ("trtllm-separate-tables", trtllm, dict(uses_shared_paged_kv_idx=False), ValueError, ["uses_shared_paged_kv_idx", "False"]),
    ("trtllm-nvfp4-out", trtllm, dict(out_dtype="nvfp4"), ValueError, ["out_dtype", "nvfp4"]),
    ("trtllm-kv-rank", trtllm, dict(mutate=setarg(1, lambda c, kv: kv[:, 0, 0])), ValueError, ["kv_cache", "(8, 2, 16)"]),
    ("xqa-mask-missing", xqa, dict(q_len_per_req=2), ValueError, ["mask", "None", "q_len_per_req=2"]),
    ("xqa-mask-dtype", xqa, dict(q_len_per_req=1, mask=torch.zeros(3, 1, 2, dtype=torch.int32)), ValueError,
     ["mask.dtype", "int32"]),
    ("xqa-q-rows", xqa, dict(mutate=setarg(0, lambda c, q: torch.randn(4, HQ, D))), ValueError, ["query.shape", "(4, 4, 16)"]),
    ("xqa-o-scale", xqa, dict(o_scale=0.0), ValueError, ["o_scale", "0.0"]),
    ("xqa-q-fp8", xqa, dict(mutate=setarg(0, lambda c, q: q.to(torch.float8_e4m3fn))), ValueError,
     ["query.dtype", "float8_e4m3fn"]),
    ("xqa-max-seq", xqa, dict(mutate=setarg(5, lambda c, x: 5)), ValueError, ["max_seq_len", "5", "13"]),
    ("cudnn-units", cudnn, dict(batch_offsets_units="bytes"), ValueError, ["batch_offsets_units", "'bytes'"]),
    ("cudnn-offsets-units", cudnn, dict(mutate=setkw("batch_offsets_q", lambda c, x: c["qo"])), ValueError,
     ["batch_offsets_q", "[0, 3, 4, 9]", "tokens"]),
    ("cudnn-lens-shape", cudnn, dict(actual_seq_lens_q=torch.ones(3, 2, dtype=torch.int32)), ValueError,
     ["actual_seq_lens_q.shape", "(3, 2)"]),
    ("cudnn-lse-shape", cudnn, dict(return_lse=True, mutate=setkw("lse", lambda c, x: torch.full((9, HQ), SENTINEL))), ValueError, ["lse.shape", "(9, 4)"]),
    ("cudnn-backend-name", cudnn, dict(backend="nope"), ValueError, ["backend", "'nope'"]),
    ("cudnn-kv-lens-missing", cudnn, dict(actual_seq_lens_kv=None), ValueError, ["actual_seq_lens_kv", "None"]),
    ("cudnn-max-token", cudnn, dict(max_token_per_sequence=4), ValueError, ["max_token_per_sequence", "4"]),
    ("paged-q-dtype-vs-plan", paged_run, dict(plan_kw=dict(dtype=torch.float16)), ValueError, ["q.dtype", "float32"]),
    ("paged-window-vs-plan", paged_run, dict(window_left=7), ValueError, ["window_left", "7"]),
    ("paged-page-size", paged_run, dict(mutate=setarg(1, lambda c, kv: kv[:, :, :2])), ValueError,
     ["paged_kv_cache.shape", "(8, 2, 2, 16)"]),
    ("paged-q-tokens", paged_run, dict(mutate=setarg(0, lambda c, q: q[:8])), ValueError, ["q.shape", "(8, 4, 16)"]),
    # The seed's run takes (q, paged_kv_cache, k_scale, v_scale, return_lse) positionally: a 6th is refused.
    ("paged-extra-args", paged_run, dict(mutate=lambda c, a, kw: a.extend([None, None, False, 1.0])), TypeError,
     ["run()", "positional"]),
    ("paged-sinks-dtype", paged_run, dict(sinks=torch.zeros(HQ, dtype=torch.float16)), ValueError, ["sinks.dtype", "float16"]),
    ("plan-last-page", paged_plan, dict(mutate=bad_last_page), ValueError, ["paged_kv_last_page_len[0]", "7"]),
    ("plan-pos-mode", paged_plan, dict(pos_encoding_mode="ROPE"), ValueError, ["pos_encoding_mode", "'ROPE'"]),
    ("plan-custom-mask-size", paged_plan, dict(custom_mask=torch.ones(5, dtype=torch.bool)), ValueError,
     ["custom_mask.shape", "(5,)"]),
    ("plan-soft-cap", paged_plan, dict(logits_soft_cap=-1.0), ValueError, ["logits_soft_cap", "-1.0"]),
    ("plan-q-data-type", paged_plan, dict(dtype="float17"), TypeError, ["q_data_type", "'float17'"]),
    ("ragged-k-dtype", ragged_run, dict(mutate=setarg(1, lambda c, k: k.double())), ValueError, ["k.dtype", "float64"]),
    ("ragged-v-heads", ragged_run, dict(mutate=setarg(2, lambda c, v: v[:, :1])), ValueError, ["v.shape", "(26, 1, 16)"]),
    ("ragged-kscale-nan", ragged_run, dict(k_scale=float("nan")), ValueError, ["k_scale", "nan"]),
    ("single-scale-q", single, dict(scale_q=torch.ones(HQ)), ValueError, ["scale_q", "(4,)"]),
    ("single-mask-shape", single, dict(custom_mask=torch.ones(4, 6, dtype=torch.bool)), ValueError,
     ["custom_mask.shape", "(4, 6)"]),
    ("single-layout", single, dict(kv_layout="XYZ"), ValueError, ["kv_layout", "'XYZ'"]),
    ("single-sm-scale", single, dict(sm_scale=float("nan")), ValueError, ["sm_scale", "nan"]),
    ("single-causal-type", single, dict(causal="yes"), TypeError, ["causal", "'yes'"]),
]


@pytest.mark.parametrize("name, call, kw, exc, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, call, kw, exc, words):
    out, lse = bufs()
    with pytest.raises(exc) as info:
        call(out, lse, **kw)
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert (out == SENTINEL).all() and (lse == SENTINEL).all()


def numpy_of(c, t):
    return t.numpy()


def numpy_plan_arg(key):
    def mutate(c, args, kw):
        c[key] = c[key].numpy()
    return mutate


# (id, caller, kwargs, the argument's name, its shape): every tensor argument, one helper's message
NUMPY_CASES = [
    ("trtllm-query", trtllm, dict(mutate=setarg(0, numpy_of)), "query", (9, HQ, D)),
    ("trtllm-kv-cache", trtllm, dict(mutate=setarg(1, numpy_of)), "kv_cache", (8, 2, P, HKV, D)),
    ("trtllm-block-tables", trtllm, dict(mutate=setarg(3, numpy_of)), "block_tables", (3, 4)),
    ("trtllm-seq-lens", trtllm, dict(mutate=setarg(4, numpy_of)), "seq_lens", (3,)),
    ("trtllm-cum-seq-lens-q", trtllm, dict(mutate=setarg(10, numpy_of)), "cum_seq_lens_q", (4,)),
    ("trtllm-out", trtllm, dict(mutate=setkw("out", numpy_of)), "out", (9, HQ, D)),
    ("trtllm-sinks", trtllm, dict(mutate=setkw("sinks", lambda c, x: torch.zeros(HQ).numpy())), "sinks", (HQ,)),
    ("xqa-query", xqa, dict(mutate=setarg(0, numpy_of)), "query", (3, HQ, D)),
    ("xqa-seq-lens", xqa, dict(mutate=setarg(4, numpy_of)), "seq_lens", (3,)),
    ("cudnn-q", cudnn, dict(mutate=setarg(0, numpy_of)), "q", (9, HQ, D)),
    ("cudnn-k-cache", cudnn, dict(mutate=setarg(1, numpy_of)), "k_cache", (8, HKV, P, D)),
    ("cudnn-v-cache", cudnn, dict(mutate=setarg(2, numpy_of)), "v_cache", (8, HKV, P, D)),
    ("cudnn-lens-kv", cudnn, dict(mutate=setkw("actual_seq_lens_kv", numpy_of)), "actual_seq_lens_kv", (3, 1, 1, 1)),
    ("paged-q", paged_run, dict(mutate=setarg(0, numpy_of)), "q", (9, HQ, D)),
    ("paged-cache", paged_run, dict(mutate=setarg(1, numpy_of)), "paged_kv_cache", (8, 2, P, HKV, D)),
    ("plan-qo-indptr", paged_plan, dict(mutate=numpy_plan_arg("qo")), "qo_indptr", (4,)),
    ("plan-indices", paged_plan, dict(mutate=numpy_plan_arg("perm")), "paged_kv_indices", (8,)),
    ("ragged-k", ragged_run, dict(mutate=setarg(1, numpy_of)), "k", (26, HKV, D)),
    ("single-q", single, dict(mutate=setarg(0, numpy_of)), "q", (4, HQ, D)),
    ("single-v", single, dict(mutate=setarg(2, numpy_of)), "v", (7, HKV, D)),
    ("single-mask", single, dict(custom_mask=torch.ones(4, 7, dtype=torch.bool).numpy()), "custom_mask", (4, 7)),
]


@pytest.mark.parametrize("name, call, kw, arg, shape", NUMPY_CASES, ids=[c[0] for c in NUMPY_CASES])
def test_a_numpy_array_is_named_by_its_type_and_shape_never_printed(name, call, kw, arg, shape):
    """An array of another library is refused naming the argument, its type, shape and dtype and what
    is allowed: one line, whatever the array's size (its repr would print every element)."""
    out, lse = bufs()
    with pytest.raises(TypeError) as info:
        call(out, lse, **kw)
    message = str(info.value)
    assert message.startswith(f"{arg}=numpy.ndarray(shape={shape}, dtype="), message
    assert "allowed a torch.Tensor" in message and "\n" not in message and len(message) < 200, message
    assert (out == SENTINEL).all() and (lse == SENTINEL).all()


def test_a_long_value_is_cut_in_an_error():
    c = ragged(q_lens=(4,), kv_lens=(7,))
    with pytest.raises(TypeError) as info:
        dispatch.single_prefill_with_kv_cache(c["q"], c["k"], c["v"], sm_scale=list(range(1000)))
    message = str(info.value)
    assert message.startswith("sm_scale=[0, 1, 2,") and " ...]" in message and len(message) < 200, message


@pytest.mark.parametrize("layout, given", [("HND", "NHD"), ("NHD", "HND")])
def test_k_and_v_in_the_other_layout_are_named_by_kv_layout(layout, given):
    """K/V shaped for one layout, passed with kv_layout naming the other: the error says which layout
    read num_kv_heads from which shape, and the shape each layout expects."""
    c = ragged(q_lens=(4,), kv_lens=(7,))
    k, v = (c["k"], c["v"]) if given == "NHD" else (c["k"].transpose(0, 1), c["v"].transpose(0, 1))
    with pytest.raises(ValueError) as info:
        dispatch.single_prefill_with_kv_cache(c["q"], k, v, kv_layout=layout)
    message = str(info.value)
    expects = {"NHD": "(kv_len, num_kv_heads, head_dim)", "HND": "(num_kv_heads, kv_len, head_dim)"}
    assert f"kv_layout={layout!r} expects: {expects[layout]}" in message, message
    assert f"k.shape={tuple(k.shape)}" in message and f"{given!r}: {expects[given]}" in message


def test_a_paged_cache_in_the_other_layout_is_named_by_kv_layout():
    c = paged(layout="HND")  # (pages, 2, Hkv, P, D) read as NHD: P=4 pages of Hkv=2 rows, heads read as 16
    args, kw = trtllm_args(c)
    args[0] = args[0][:, :3]  # 3 query heads: never a multiple of the heads the layout reads
    with pytest.raises(ValueError) as info:
        dispatch.trtllm_batch_context_with_kv_cache(*args, **{**kw, "kv_layout": "NHD"})
    message = str(info.value)
    assert "kv_layout='NHD' expects: (pages, page_size, num_kv_heads, head_dim)" in message, message
    assert f"kv_cache's K half of shape={(8, HKV, P, D)}" in message


def test_at_least_35_kinds():
    assert len({c[0] for c in CASES}) >= 35


def test_wrapper_constructor_layout():
    with pytest.raises(ValueError, match=r"kv_layout='NCHW': allowed 'NHD' or 'HND'"):
        dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NCHW")


def test_cudnn_wrapper_element_units_checked_at_plan():
    c = ragged()
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws(), "NHD", backend="cudnn")
    with pytest.raises(ValueError, match=r"qo_indptr=\[0, 3, 4, 9\].*element offsets"):
        w.plan(c["qo"], c["kv"] * HKV * D, HQ, HKV, D, causal=True, q_data_type=torch.float32)


def test_run_before_plan():
    c = paged()
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD")
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(c["q"], c["cache"])


def test_second_call_same_key_still_checks_values():
    """The signature cache skips static checks only: sizes and (CPU) values are checked per call."""
    c = paged()
    args, kw = trtllm_args(c)
    dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)
    args[3] = c["table"].index_fill(1, torch.tensor([0]), 99)
    out = torch.full((TOTAL_Q, HQ, D), SENTINEL)
    with pytest.raises(ValueError, match="block_tables=99"):
        dispatch.trtllm_batch_context_with_kv_cache(*args, out=out, **kw)
    assert (out == SENTINEL).all()
