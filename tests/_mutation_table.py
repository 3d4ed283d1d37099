"""The bad-input battery of test_mutations.py: one row per kind of mistake.

A row is ``M(entry, kind, changes, exc, *words, forbid=())``: ``changes`` maps an argument
name (positional ones by their seed name; ``ctor.<name>`` for a wrapper constructor) to a new
value or to ``fn(call, old) -> new``; the call must raise ``exc`` with a message containing
every word (the argument, its bad value) and "allowed", and none of ``forbid`` (internal names).
Base calls come from _calls.make (B=3 requests, q_lens 3,1,5, kv_lens 9,4,13, Hq=4, Hkv=2,
D=16, page size 4, 10 pages, fp32); xqa has one query per request.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

B, N, HQ, HKV, D, P, PAGES = 3, 9, 4, 2, 16, 4, 10
META = torch.device("meta")
NAN, INF = float("nan"), float("inf")
POSITIONAL = {
    "trtllm": ["query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_q_len", "max_kv_len",
               "bmm1_scale", "bmm2_scale", "batch_size", "cum_seq_lens_q", "cum_seq_lens_kv"],
    "xqa": ["query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len", "bmm1_scale",
            "bmm2_scale"],
    "cudnn": ["q", "k_cache", "v_cache", "scale", "workspace_buffer"],
    "paged": ["q", "paged_kv_cache"], "ragged": ["q", "k", "v"],
    "single": ["q", "k", "v"], "single_lse": ["q", "k", "v"],
}
PLAN_POSITIONAL = {
    "paged": ["qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
              "num_kv_heads", "head_dim", "page_size"],
    "ragged": ["qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim"],
}
PLAN_KW = {"custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode", "allow_fp16_qk_reduction", "sm_scale",
           "logits_soft_cap", "rope_scale", "rope_theta", "q_data_type", "kv_data_type",
           "o_data_type", "head_dim_vo"}


@dataclass
class M:
    entry: str
    kind: str
    changes: dict
    exc: type
    words: tuple
    forbid: tuple = ()
    base: tuple = ()  # changes made to the good call and the bad one alike (the warm key they share)

    @property
    def id(self) -> str:
        return f"{self.entry}-{self.kind}"


def m(entry, kind, changes, exc, *words, forbid=(), base=None):
    return M(entry, kind, changes, exc, words, forbid, tuple((base or {}).items()))


# sinks that change nothing (exp(-inf) = 0): a good call with sinks keeps its fp64 expectation
NO_SINKS = {"sinks": lambda c, t: torch.full((HQ,), -INF)}


def where(call, name: str):
    """(container, key, stage) of an argument of the call: stage is ctor, plan or run."""
    if name.startswith("ctor."):
        return call.ctor_kw, name[5:], "ctor"
    if call.wrapper:
        if name in PLAN_POSITIONAL[call.entry]:
            return call.plan_args, PLAN_POSITIONAL[call.entry].index(name), "plan"
        if name in PLAN_KW or name.startswith("plan."):
            key = name[5:] if name.startswith("plan.") else name
            return call.plan_kw, key, "plan"
    if name in POSITIONAL[call.entry]:
        return call.args, POSITIONAL[call.entry].index(name), "run"
    return call.kw, name, "run"


def apply(call, changes: dict) -> set:
    stages = set()
    for name, change in changes.items():
        box, key, stage = where(call, name)
        old = box[key] if isinstance(box, list) or key in box else None
        new = change(call, old) if callable(change) and not isinstance(change, (torch.Tensor, type)) else change
        if new is DROP:
            box.pop(key, None)
        else:
            box[key] = new
        stages.add(stage)
    return stages


DROP = object()


# -- small mutation helpers ----------------------------------------------------------------------
def to(x):
    return lambda c, t: t.to(x)


def put(index, value):
    def fn(c, t):
        t = t.clone()
        t.view(-1)[index] = value
        return t
    return fn


def ints(*values):
    return lambda c, t: torch.tensor(values, dtype=torch.int32).view(*((-1,) + tuple(t.shape[1:])))


def randn(*shape, dtype=torch.float32):
    return lambda c, t: torch.randn(*shape).to(dtype)


def wide(c, t):  # same values, last stride 2
    buf = torch.randn(*t.shape[:-1], t.shape[-1] * 2).to(t.dtype)
    return buf[..., ::2]


def nan_like(shape, dtype=torch.float32):
    return lambda c, t: torch.full(shape, NAN, dtype=torch.float32).to(dtype)


def tensor(value, dtype=torch.float32):
    return lambda c, t: torch.tensor(value, dtype=dtype)


OUT_INT = lambda c, t: torch.zeros(t.shape, dtype=torch.int32)  # noqa: E731
HIDE = ("o_data_type", "out_dtype")  # an int32 `out` must be blamed on `out`


def _common_out(entry, n_rows, lse=True, lse_shape=None):
    rows = [
        m(entry, "out-shape", {"out": nan_like((n_rows, HQ, 8))}, ValueError, "out", f"({n_rows}, {HQ}, 8)"),
        m(entry, "out-dtype-int32", {"out": OUT_INT}, ValueError, "out", "int32", forbid=HIDE),
        m(entry, "out-device", {"out": to(META)}, ValueError, "out", "meta"),
        m(entry, "out-type", {"out": "buffer"}, TypeError, "out", "'buffer'"),
    ]
    if lse:
        rows += [
            m(entry, "lse-shape", {"lse": nan_like((n_rows + 1, HQ))}, ValueError, "lse", f"({n_rows + 1}, {HQ})"),
            m(entry, "lse-dtype", {"lse": nan_like(lse_shape or (n_rows, HQ), torch.float16)}, ValueError, "lse",
              "float16"),
            m(entry, "lse-device", {"lse": to(META)}, ValueError, "lse", "meta"),
        ]
    return rows


def _trtllm_rows():
    e = "trtllm"
    return _common_out(e, N) + [
        m(e, "query-type", {"query": "q"}, TypeError, "query", "'q'"),
        m(e, "query-rank", {"query": lambda c, q: q.reshape(N, -1)}, ValueError, "query", "(9, 64)"),
        m(e, "query-dtype-int32", {"query": to(torch.int32)}, ValueError, "query", "int32"),
        m(e, "query-dtype-float64", {"query": to(torch.float64)}, ValueError, "query", "float64"),
        m(e, "query-stride", {"query": wide}, ValueError, "query", "stride"),
        m(e, "kv-dtype", {"kv_cache": to(torch.float16)}, ValueError, "kv_cache", "float16"),
        m(e, "kv-type", {"kv_cache": "cache"}, TypeError, "kv_cache", "'cache'"),
        m(e, "kv-rank", {"kv_cache": lambda c, t: t[:, 0]}, ValueError, "kv_cache", "(10, 2, 4, 16)"),
        m(e, "kv-tuple-of-3", {"kv_cache": lambda c, t: (t[:, 0], t[:, 1], t[:, 0])}, TypeError, "kv_cache"),
        m(e, "kv-heads-not-dividing", {"kv_cache": randn(PAGES, 2, 3, P, D)}, ValueError, "num_kv_heads", "3"),
        m(e, "kv-head-dim", {"kv_cache": randn(PAGES, 2, HKV, P, 8)}, ValueError, "head_dim", "8"),
        m(e, "kv-device", {"kv_cache": to(META)}, ValueError, "kv_cache", "meta"),
        m(e, "table-dtype", {"block_tables": to(torch.int64)}, ValueError, "block_tables", "int64"),
        m(e, "table-rows", {"block_tables": lambda c, t: t[:2]}, ValueError, "block_tables", "(2, 5)"),
        m(e, "table-rank", {"block_tables": lambda c, t: t.reshape(-1)}, ValueError, "block_tables", "(15,)"),
        m(e, "table-page-id", {"block_tables": put(0, 77)}, ValueError, "block_tables", "77"),
        m(e, "table-negative-id", {"block_tables": put(0, -4)}, ValueError, "block_tables", "-4"),
        m(e, "table-device", {"block_tables": to(META)}, ValueError, "block_tables", "meta"),
        m(e, "seq-negative", {"seq_lens": ints(9, -1, 13)}, ValueError, "seq_lens", "-1"),
        m(e, "seq-too-long", {"seq_lens": ints(9, 4, 99), "max_kv_len": 99}, ValueError, "seq_lens", "99"),
        m(e, "seq-dtype", {"seq_lens": to(torch.float32)}, ValueError, "seq_lens", "float32"),
        m(e, "seq-B+1", {"seq_lens": ints(9, 4, 13, 2)}, ValueError, "seq_lens", "(4,)"),
        m(e, "seq-device", {"seq_lens": to(META)}, ValueError, "seq_lens", "meta"),
        m(e, "max-q-small", {"max_q_len": 2}, ValueError, "max_q_len", "2"),
        m(e, "max-q-type", {"max_q_len": 5.0}, TypeError, "max_q_len", "5.0"),
        m(e, "max-kv-small", {"max_kv_len": 5}, ValueError, "max_kv_len", "5"),
        m(e, "batch-zero", {"batch_size": 0}, ValueError, "batch_size", "0"),
        m(e, "batch-mismatch", {"batch_size": 2}, ValueError, "batch_size", "2"),
        m(e, "cumq-order", {"cum_seq_lens_q": ints(0, 5, 4, 9)}, ValueError, "cum_seq_lens_q", "4"),
        m(e, "cumq-end", {"cum_seq_lens_q": ints(0, 3, 4, 8)}, ValueError, "cum_seq_lens_q", "8"),
        m(e, "cumq-start", {"cum_seq_lens_q": ints(1, 3, 4, 9)}, ValueError, "cum_seq_lens_q", "1"),
        m(e, "cumq-dtype", {"cum_seq_lens_q": to(torch.int64)}, ValueError, "cum_seq_lens_q", "int64"),
        m(e, "bmm1-nan", {"bmm1_scale": NAN}, ValueError, "bmm1_scale", "nan"),
        m(e, "bmm1-inf", {"bmm1_scale": INF}, ValueError, "bmm1_scale", "inf"),
        m(e, "bmm1-str", {"bmm1_scale": "0.25"}, TypeError, "bmm1_scale", "'0.25'"),
        m(e, "bmm1-tensor-2", {"bmm1_scale": tensor([0.25, 0.25])}, ValueError, "bmm1_scale", "(2,)"),
        m(e, "bmm1-tensor-f64", {"bmm1_scale": tensor(0.25, torch.float64)}, ValueError, "bmm1_scale", "float64"),
        m(e, "bmm1-tensor-nan", {"bmm1_scale": tensor(NAN)}, ValueError, "bmm1_scale", "nan"),
        m(e, "bmm2-nan", {"bmm2_scale": NAN}, ValueError, "bmm2_scale", "nan"),
        m(e, "window", {"window_left": -2}, ValueError, "window_left", "-2"),
        m(e, "window-type", {"window_left": "5"}, TypeError, "window_left", "'5'"),
        m(e, "layout", {"kv_layout": "NCHW"}, ValueError, "kv_layout", "'NCHW'"),
        m(e, "out-dtype-nvfp4", {"out_dtype": "nvfp4"}, ValueError, "out_dtype", "nvfp4"),
        m(e, "out-dtype-int8", {"out_dtype": torch.int8, "out": None}, ValueError, "out_dtype", "int8"),
        m(e, "sinks-shape", {"sinks": randn(3)}, ValueError, "sinks", "(3,)"),
        m(e, "sinks-dtype", {"sinks": randn(HQ, dtype=torch.float16)}, ValueError, "sinks", "float16"),
        m(e, "sinks-list-len", {"sinks": [0.5, 0.5, 0.5]}, ValueError, "sinks", "3"),
        m(e, "sinks-device", {"sinks": lambda c, t: torch.zeros(HQ, device=META)}, ValueError, "sinks", "meta"),
        m(e, "separate-tables", {"uses_shared_paged_kv_idx": False}, ValueError, "uses_shared_paged_kv_idx", "False"),
        m(e, "kv-cache-sf", {"kv_cache_sf": randn(PAGES, 2)}, ValueError, "kv_cache_sf"),
        m(e, "causal-type", {"causal": "yes"}, TypeError, "causal", "'yes'"),
        m(e, "return-lse-type", {"return_lse": "no"}, TypeError, "return_lse", "'no'"),
        m(e, "sinks-len-after-sinks", {"sinks": randn(HQ + 1)}, ValueError, "sinks", "(5,)", base=NO_SINKS),
    ]


def _xqa_rows():
    e = "xqa"
    return _common_out(e, B, lse=False) + [
        m(e, "query-rank", {"query": lambda c, q: q.reshape(B, -1)}, ValueError, "query", "(3, 64)"),
        m(e, "query-dtype-int32", {"query": to(torch.int32)}, ValueError, "query", "int32"),
        m(e, "query-fp8", {"query": to(torch.float8_e4m3fn)}, ValueError, "query", "float8_e4m3fn"),
        m(e, "query-type", {"query": 1.0}, TypeError, "query", "1.0"),
        m(e, "query-rows", {"query": randn(4, HQ, D)}, ValueError, "query", "(4, 4, 16)"),
        m(e, "kv-dtype", {"kv_cache": to(torch.float16)}, ValueError, "kv_cache", "float16"),
        m(e, "kv-heads-not-dividing", {"kv_cache": randn(PAGES, 2, P, 3, D)}, ValueError, "num_kv_heads", "3"),
        m(e, "kv-head-dim", {"kv_cache": randn(PAGES, 2, P, HKV, 8)}, ValueError, "head_dim", "8"),
        m(e, "kv-rank", {"kv_cache": lambda c, t: t[:, 0, 0]}, ValueError, "kv_cache", "(10, 2, 16)"),
        m(e, "kv-device", {"kv_cache": to(META)}, ValueError, "kv_cache", "meta"),
        m(e, "table-dtype", {"block_tables": to(torch.int64)}, ValueError, "block_tables", "int64"),
        m(e, "table-rows", {"block_tables": lambda c, t: t[:2]}, ValueError, "block_tables", "(2, 5)"),
        m(e, "table-page-id", {"block_tables": put(0, 77)}, ValueError, "block_tables", "77"),
        m(e, "table-negative-id", {"block_tables": put(5, -5)}, ValueError, "block_tables", "-5"),
        m(e, "seq-negative", {"seq_lens": ints(9, -2, 13)}, ValueError, "seq_lens", "-2"),
        m(e, "seq-too-long", {"seq_lens": ints(9, 4, 25), "max_seq_len": 25}, ValueError, "seq_lens", "25"),
        m(e, "seq-dtype", {"seq_lens": to(torch.float32)}, ValueError, "seq_lens", "float32"),
        m(e, "seq-B+1", {"seq_lens": ints(9, 4, 13, 1)}, ValueError, "seq_lens", "(4,)"),
        m(e, "max-seq-small", {"max_seq_len": 5}, ValueError, "max_seq_len", "5"),
        m(e, "max-seq-type", {"max_seq_len": "13"}, TypeError, "max_seq_len", "'13'"),
        m(e, "bmm1-nan", {"bmm1_scale": NAN}, ValueError, "bmm1_scale", "nan"),
        m(e, "bmm2-inf", {"bmm2_scale": INF}, ValueError, "bmm2_scale", "inf"),
        m(e, "bmm1-str", {"bmm1_scale": "1"}, TypeError, "bmm1_scale", "'1'"),
        m(e, "window", {"window_left": -3}, ValueError, "window_left", "-3"),
        m(e, "sinks-shape", {"sinks": randn(2)}, ValueError, "sinks", "(2,)"),
        m(e, "sinks-dtype", {"sinks": randn(HQ, dtype=torch.float64)}, ValueError, "sinks", "float64"),
        m(e, "sinks-len-after-sinks", {"sinks": randn(HQ + 1)}, ValueError, "sinks", "(5,)", base=NO_SINKS),
        m(e, "layout", {"kv_layout": "nhd"}, ValueError, "kv_layout", "'nhd'"),
        m(e, "q-len-zero", {"q_len_per_req": 0}, ValueError, "q_len_per_req", "0"),
        m(e, "mask-missing", {"q_len_per_req": 2}, ValueError, "mask", "None"),
        m(e, "mask-dtype", {"q_len_per_req": 1, "mask": lambda c, t: torch.zeros(B, 1, 2, dtype=torch.int32)},
          ValueError, "mask", "int32"),
        m(e, "o-scale-nan", {"o_scale": NAN}, ValueError, "o_scale", "nan"),
        m(e, "o-scale-zero", {"o_scale": 0.0}, ValueError, "o_scale", "0.0"),
        m(e, "o-scale-inf", {"o_scale": INF}, ValueError, "o_scale", "inf"),
        m(e, "o-scale-type", {"o_scale": "2"}, TypeError, "o_scale", "'2'"),
        m(e, "kv-cache-sf", {"kv_cache_sf": randn(PAGES, 2)}, ValueError, "kv_cache_sf"),
        m(e, "q-cu-dtype", {"q_len_per_req": 2, "q_cu_seq_lens": lambda c, t: torch.tensor([0, 1, 2, 3]),
                            "mask": lambda c, t: torch.zeros(B, 2, dtype=torch.uint16)},
          ValueError, "q_cu_seq_lens", "int64"),
    ]


def _cudnn_ragged(c, t):
    """Switch the base paged call to ragged 3-D K/V (lengths 9, 4, 13; offsets from the lengths)."""
    return torch.randn(26, HKV, D)


def _cudnn_rows():
    e = "cudnn"
    ragged = {"k_cache": _cudnn_ragged, "v_cache": _cudnn_ragged, "block_tables": None}
    return _common_out(e, N, lse_shape=(B, 5, HQ)) + [
        m(e, "q-rank", {"q": lambda c, q: q.reshape(N, -1)}, ValueError, "q", "(9, 64)"),
        m(e, "q-dtype", {"q": to(torch.int32)}, ValueError, "q", "int32"),
        m(e, "q-type", {"q": None}, TypeError, "q", "None"),
        m(e, "k-dtype", {"k_cache": to(torch.float16)}, ValueError, "k_cache", "float16"),
        m(e, "k-rank", {"k_cache": lambda c, t: t[:, 0]}, ValueError, "k_cache", "(10, 4, 16)"),
        m(e, "v-heads", {"v_cache": lambda c, t: t[:, :1]}, ValueError, "v_cache", "(10, 1, 4, 16)"),
        m(e, "kv-heads-not-dividing", {"k_cache": randn(PAGES, 3, P, D), "v_cache": randn(PAGES, 3, P, D)},
          ValueError, "num_kv_heads", "3"),
        m(e, "k-head-dim", {"k_cache": randn(PAGES, HKV, P, 8)}, ValueError, "k_cache", "8"),
        m(e, "k-device", {"k_cache": to(META)}, ValueError, "k_cache", "meta"),
        m(e, "scale-nan", {"scale": NAN}, ValueError, "scale", "nan"),
        m(e, "scale-inf", {"scale": -INF}, ValueError, "scale", "-inf"),
        m(e, "scale-str", {"scale": "0.25"}, TypeError, "scale", "'0.25'"),
        m(e, "max-token-small", {"max_token_per_sequence": 4}, ValueError, "max_token_per_sequence", "4"),
        m(e, "max-token-zero", {"max_token_per_sequence": 0}, ValueError, "max_token_per_sequence", "0"),
        m(e, "max-token-type", {"max_token_per_sequence": 5.5}, TypeError, "max_token_per_sequence", "5.5"),
        m(e, "max-kv-small", {"max_sequence_kv": 5}, ValueError, "max_sequence_kv", "5"),
        m(e, "lens-q-B+1", {"actual_seq_lens_q": ints(3, 1, 5, 2)}, ValueError, "actual_seq_lens_q", "(4, 1, 1, 1)"),
        m(e, "lens-kv-B+1", {"actual_seq_lens_kv": ints(9, 4, 13, 2)}, ValueError, "actual_seq_lens_kv",
          "(4, 1, 1, 1)"),
        m(e, "lens-q-values", {"actual_seq_lens_q": ints(2, 2, 5)}, ValueError, "actual_seq_lens_q", "[2, 2, 5]"),
        m(e, "lens-q-dtype", {"actual_seq_lens_q": to(torch.int64)}, ValueError, "actual_seq_lens_q", "int64"),
        m(e, "lens-kv-negative", {"actual_seq_lens_kv": ints(9, -1, 13)}, ValueError, "actual_seq_lens_kv", "-1"),
        m(e, "lens-kv-too-long", {"actual_seq_lens_kv": ints(9, 4, 30), "max_sequence_kv": 30}, ValueError,
          "actual_seq_lens_kv", "30"),
        m(e, "table-page-id", {"block_tables": put(0, 77)}, ValueError, "block_tables", "77"),
        m(e, "table-negative-id", {"block_tables": put(10, -1)}, ValueError, "block_tables", "-1"),
        m(e, "table-dtype", {"block_tables": to(torch.int64)}, ValueError, "block_tables", "int64"),
        m(e, "table-rows", {"block_tables": lambda c, t: t[:2]}, ValueError, "block_tables", "(2, 5)"),
        m(e, "offsets-q-units", {"batch_offsets_q": ints(0, 3, 4, 9)}, ValueError, "batch_offsets_q", "[0, 3, 4, 9]"),
        m(e, "offsets-q-order", {"batch_offsets_q": lambda c, t: t.flip(0)}, ValueError, "batch_offsets_q"),
        m(e, "offsets-o-mismatch", {"batch_offsets_o": lambda c, t: t * 2}, ValueError, "batch_offsets_o"),
        m(e, "offsets-units", {"batch_offsets_units": "bytes"}, ValueError, "batch_offsets_units", "'bytes'"),
        m(e, "o-data-type", {"o_data_type": torch.int8, "out": None}, ValueError, "o_data_type", "int8"),
        m(e, "causal-type", {"causal": "yes"}, TypeError, "causal", "'yes'"),
        m(e, "return-lse-type", {"return_lse": None}, TypeError, "return_lse", "None"),
        m(e, "q-scale-nan", {"q_scale": NAN}, ValueError, "q_scale", "nan"),
        m(e, "v-scale-inf", {"v_scale": INF}, ValueError, "v_scale", "inf"),
        m(e, "backend", {"backend": "nope"}, ValueError, "backend", "'nope'"),
        m(e, "ragged-kv-negative", dict(ragged, actual_seq_lens_kv=ints(9, -1, 13)), ValueError,
          "actual_seq_lens_kv", "-1"),
        m(e, "ragged-kv-too-long", dict(ragged, actual_seq_lens_kv=ints(9, 4, 20), max_sequence_kv=20), ValueError,
          "actual_seq_lens_kv", "20"),
    ]


def _plan_rows(e):
    rows = [
        m(e, "qo-order", {"qo_indptr": ints(0, 4, 3, 9)}, ValueError, "qo_indptr", "3"),
        m(e, "qo-dtype", {"qo_indptr": to(torch.int64)}, ValueError, "qo_indptr", "int64"),
        m(e, "qo-rank", {"qo_indptr": lambda c, t: t.view(2, 2)}, ValueError, "qo_indptr", "(2, 2)"),
        m(e, "qo-one-entry", {"qo_indptr": ints(0)}, ValueError, "qo_indptr", "(1,)"),
        m(e, "qo-start", {"qo_indptr": ints(2, 3, 4, 9)}, ValueError, "qo_indptr", "2"),
        m(e, "heads-not-dividing", {"num_qo_heads": 3}, ValueError, "num_qo_heads", "3"),
        m(e, "kv-heads-zero", {"num_kv_heads": 0}, ValueError, "num_kv_heads", "0"),
        m(e, "head-dim-zero", {"head_dim": 0}, ValueError, "head_dim", "0"),
        m(e, "head-dim-type", {"head_dim": "16"}, TypeError, "head_dim", "'16'"),
        m(e, "mask-size", {"custom_mask": lambda c, t: torch.ones(5, dtype=torch.bool)}, ValueError, "custom_mask",
          "(5,)"),
        m(e, "mask-dtype", {"custom_mask": lambda c, t: torch.ones(96)}, ValueError, "custom_mask", "float32"),
        m(e, "packed-mask-size", {"packed_custom_mask": lambda c, t: torch.ones(3, dtype=torch.uint8)}, ValueError,
          "packed_custom_mask", "(3,)"),
        m(e, "pos-mode", {"pos_encoding_mode": "ROPE"}, ValueError, "pos_encoding_mode", "'ROPE'"),
        m(e, "window", {"plan.window_left": -2}, ValueError, "window_left", "-2"),
        m(e, "soft-cap-negative", {"logits_soft_cap": -1.0}, ValueError, "logits_soft_cap", "-1.0"),
        m(e, "soft-cap-nan", {"logits_soft_cap": NAN}, ValueError, "logits_soft_cap", "nan"),
        m(e, "sm-scale-nan", {"sm_scale": NAN}, ValueError, "sm_scale", "nan"),
        m(e, "rope-scale-zero", {"rope_scale": 0.0}, ValueError, "rope_scale", "0.0"),
        m(e, "rope-theta-negative", {"rope_theta": -1.0}, ValueError, "rope_theta", "-1.0"),
        m(e, "q-data-type-name", {"q_data_type": "float17"}, TypeError, "q_data_type", "'float17'"),
        m(e, "q-data-type-int", {"q_data_type": torch.int32}, ValueError, "q_data_type", "int32"),
        m(e, "kv-data-type", {"kv_data_type": torch.int8}, ValueError, "kv_data_type", "int8"),
        m(e, "causal-type", {"causal": "yes"}, TypeError, "causal", "'yes'"),
        m(e, "o-data-type", {"o_data_type": torch.int32}, ValueError, "o_data_type", "int32"),
        m(e, "ctor-layout", {"ctor.kv_layout": "NCHW"}, ValueError, "kv_layout", "'NCHW'"),
        m(e, "ctor-backend", {"ctor.backend": "nope"}, ValueError, "backend", "'nope'"),
        m(e, "ctor-jit-args", {"ctor.jit_args": [1]}, ValueError, "jit_args", "[1]"),
    ]
    return rows


def _run_rows(e):
    return _common_out(e, N) + [
        m(e, "q-dtype-vs-plan", {"q": to(torch.float16)}, ValueError, "q", "float16"),
        m(e, "q-heads", {"q": lambda c, q: q[:, :2]}, ValueError, "q", "(9, 2, 16)"),
        m(e, "q-tokens", {"q": lambda c, q: q[:8]}, ValueError, "q", "(8, 4, 16)"),
        m(e, "q-rank", {"q": lambda c, q: q.reshape(N, -1)}, ValueError, "q", "(9, 64)"),
        m(e, "q-device", {"q": to(META)}, ValueError, "q", "meta"),
        m(e, "k-scale-nan", {"k_scale": NAN}, ValueError, "k_scale", "nan"),
        m(e, "v-scale-inf", {"v_scale": INF}, ValueError, "v_scale", "inf"),
        m(e, "q-scale-str", {"q_scale": "1"}, TypeError, "q_scale", "'1'"),
        m(e, "k-scale-tensor-2", {"k_scale": tensor([1.0, 1.0])}, ValueError, "k_scale", "(2,)"),
        m(e, "return-lse-type", {"return_lse": "yes"}, TypeError, "return_lse", "'yes'"),
        m(e, "kv-cache-sf", {"kv_cache_sf": randn(PAGES, 2)}, ValueError, "kv_cache_sf"),
    ]


def _paged_rows():
    e = "paged"
    return _plan_rows(e) + _run_rows(e) + [
        m(e, "kv-indptr-order", {"paged_kv_indptr": ints(0, 3, 2, 8)}, ValueError, "paged_kv_indptr", "2"),
        m(e, "kv-indptr-len", {"paged_kv_indptr": ints(0, 3, 4, 8, 8)}, ValueError, "paged_kv_indptr", "(5,)"),
        m(e, "indices-negative", {"paged_kv_indices": put(2, -3)}, ValueError, "paged_kv_indices", "-3"),
        m(e, "indices-out-of-range", {"paged_kv_indices": put(2, 77)}, ValueError, "paged_kv_indices", "77"),
        m(e, "indices-short", {"paged_kv_indices": lambda c, t: t[:5]}, ValueError, "paged_kv_indices", "(5,)"),
        m(e, "last-page-zero", {"paged_kv_last_page_len": ints(0, 4, 1)}, ValueError, "paged_kv_last_page_len", "0"),
        m(e, "last-page-too-long", {"paged_kv_last_page_len": ints(1, 4, 5)}, ValueError, "paged_kv_last_page_len",
          "5"),
        m(e, "page-size-zero", {"page_size": 0}, ValueError, "page_size", "0"),
        m(e, "cache-dtype", {"paged_kv_cache": to(torch.float16)}, ValueError, "paged_kv_cache", "float16"),
        m(e, "cache-page-size", {"paged_kv_cache": lambda c, t: t[:, :, :2]}, ValueError, "paged_kv_cache",
          "(10, 2, 2, 2, 16)"),
        m(e, "cache-kv-heads", {"paged_kv_cache": lambda c, t: t[:, :, :, :1]}, ValueError, "paged_kv_cache",
          "(10, 2, 4, 1, 16)"),
        m(e, "cache-head-dim", {"paged_kv_cache": lambda c, t: t[..., :8]}, ValueError, "paged_kv_cache", "8"),
        m(e, "cache-type", {"paged_kv_cache": "kv"}, TypeError, "paged_kv_cache", "'kv'"),
        m(e, "cache-rank", {"paged_kv_cache": lambda c, t: t[:, 0, 0]}, ValueError, "paged_kv_cache", "(10, 2, 16)"),
        m(e, "cache-device", {"paged_kv_cache": to(META)}, ValueError, "paged_kv_cache", "meta"),
        m(e, "cache-too-few-pages", {"paged_kv_cache": lambda c, t: t[:3]}, ValueError, "paged_kv_cache", "3"),
        m(e, "sinks-shape", {"sinks": randn(HQ + 1)}, ValueError, "sinks", "(5,)"),
        m(e, "sinks-dtype", {"sinks": randn(HQ, dtype=torch.float16)}, ValueError, "sinks", "float16"),
        m(e, "sinks-len-after-sinks", {"sinks": randn(HQ + 1)}, ValueError, "sinks", "(5,)", base=NO_SINKS),
        m(e, "window-vs-plan", {"window_left": 7}, ValueError, "window_left", "7"),
    ]


def _ragged_rows():
    e = "ragged"
    return _plan_rows(e) + _run_rows(e) + [
        m(e, "kv-indptr-order", {"kv_indptr": ints(0, 9, 8, 26)}, ValueError, "kv_indptr", "8"),
        m(e, "kv-indptr-len", {"kv_indptr": ints(0, 9, 26)}, ValueError, "kv_indptr", "(3,)"),
        m(e, "kv-indptr-start", {"kv_indptr": ints(-2, 9, 13, 26)}, ValueError, "kv_indptr", "-2"),
        m(e, "head-dim-vo-zero", {"head_dim_vo": 0}, ValueError, "head_dim_vo", "0"),
        m(e, "k-heads-vs-plan", {"k": randn(26, 1, D), "v": randn(26, 1, D)}, ValueError, "k", "(26, 1, 16)"),
        m(e, "v-head-dim-vs-plan", {"v": randn(26, HKV, 8)}, ValueError, "v", "(26, 2, 8)"),
        m(e, "k-dtype", {"k": to(torch.float64)}, ValueError, "k", "float64"),
        m(e, "k-rows-short", {"k": lambda c, t: t[:20]}, ValueError, "k", "(20, 2, 16)"),
        m(e, "k-rank", {"k": lambda c, t: t.reshape(26, -1)}, ValueError, "k", "(26, 32)"),
        m(e, "v-device", {"v": to(META)}, ValueError, "v", "meta"),
        m(e, "k-type", {"k": [1.0]}, TypeError, "k", "[1.0]"),
        m(e, "o-scale-zero", {"o_scale": 0.0}, ValueError, "o_scale", "0.0"),
        m(e, "o-scale-nan", {"o_scale": NAN}, ValueError, "o_scale", "nan"),
    ]


def _single_rows(e):
    rows = [
        m(e, "q-rank", {"q": lambda c, q: q.reshape(3, -1)}, ValueError, "q", "(3, 64)"),
        m(e, "q-dtype", {"q": to(torch.int32)}, ValueError, "q", "int32"),
        m(e, "k-dtype", {"k": to(torch.float16)}, ValueError, "k", "float16"),
        m(e, "kv-heads-not-dividing", {"k": randn(9, 3, D), "v": randn(9, 3, D)}, ValueError, "num_kv_heads", "3"),
        m(e, "k-head-dim", {"k": randn(9, HKV, 8)}, ValueError, "k", "(9, 2, 8)"),
        m(e, "v-kv-len", {"v": randn(8, HKV, D)}, ValueError, "v", "(8, 2, 16)"),
        m(e, "k-device", {"k": to(META)}, ValueError, "k", "meta"),
        m(e, "mask-shape", {"custom_mask": lambda c, t: torch.ones(3, 8, dtype=torch.bool)}, ValueError,
          "custom_mask", "(3, 8)"),
        m(e, "layout", {"kv_layout": "XYZ"}, ValueError, "kv_layout", "'XYZ'"),
        m(e, "sm-scale-nan", {"sm_scale": NAN}, ValueError, "sm_scale", "nan"),
        m(e, "causal-type", {"causal": "yes"}, TypeError, "causal", "'yes'"),
    ]
    if e == "single_lse":
        return rows
    return rows + [
        m(e, "q-type", {"q": "q"}, TypeError, "q", "'q'"),
        m(e, "q-stride", {"q": wide}, ValueError, "q", "stride"),
        m(e, "mask-dtype", {"custom_mask": lambda c, t: torch.ones(3, 9)}, ValueError, "custom_mask", "float32"),
        m(e, "packed-mask-dtype", {"packed_custom_mask": lambda c, t: torch.ones(4, dtype=torch.int32)}, ValueError,
          "packed_custom_mask", "int32"),
        m(e, "packed-mask-size", {"packed_custom_mask": lambda c, t: torch.ones(9, dtype=torch.uint8)}, ValueError,
          "packed_custom_mask", "(9,)"),
        m(e, "pos-mode", {"pos_encoding_mode": "ALIBI2"}, ValueError, "pos_encoding_mode", "'ALIBI2'"),
        m(e, "window", {"window_left": -5}, ValueError, "window_left", "-5"),
        m(e, "soft-cap-nan", {"logits_soft_cap": NAN}, ValueError, "logits_soft_cap", "nan"),
        m(e, "sm-scale-inf", {"sm_scale": INF}, ValueError, "sm_scale", "inf"),
        m(e, "sm-scale-str", {"sm_scale": "0.1"}, TypeError, "sm_scale", "'0.1'"),
        m(e, "rope-theta-zero", {"rope_theta": 0.0}, ValueError, "rope_theta", "0.0"),
        m(e, "return-lse-type", {"return_lse": "yes"}, TypeError, "return_lse", "'yes'"),
        m(e, "k-scale-nan", {"k_scale": NAN}, ValueError, "k_scale", "nan"),
        m(e, "v-scale-inf", {"v_scale": INF}, ValueError, "v_scale", "inf"),
        m(e, "scale-q-per-head", {"scale_q": randn(HQ)}, ValueError, "scale_q", "(4,)"),
        m(e, "kv-cache-sf", {"kv_cache_sf": randn(9, 2)}, ValueError, "kv_cache_sf"),
        m(e, "o-dtype", {"o_dtype": torch.int8}, ValueError, "o_dtype", "int8"),
        m(e, "backend", {"backend": "nope"}, ValueError, "backend", "'nope'"),
    ]


ROWS = (_trtllm_rows() + _xqa_rows() + _cudnn_rows() + _paged_rows() + _ragged_rows() + _single_rows("single")
        + _single_rows("single_lse"))
