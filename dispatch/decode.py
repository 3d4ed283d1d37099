"""FlashInfer-compatible decode entry point (``flashinfer.decode.xqa_batch_decode_with_kv_cache``)."""
from __future__ import annotations

from . import policy, router
from . import _entry as E
from ._normalize import uniform_indptr
from .prefill import _problem
from .problem import AttentionBatch
from .specs import XqaDecodeSpec

_SIZES = ("max_seq_len", "bmm1_scale", "bmm2_scale", "o_scale")
_IGNORED = ("workspace_buffer", "enable_pdl")


def xqa_batch_decode_with_kv_cache(
    query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0,
    window_left=-1, out=None, sinks=None, kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0,
    mask=None, kv_cache_sf=None, q_cu_seq_lens=None,
):
    """Paged decode (q_len_per_req = 1) or speculative decode (> 1, with the uint16 draft ``mask``;
    ragged drafts via q_cu_seq_lens). out = bmm2_scale * softmax(bmm1_scale * q.k) v: ``o_scale``
    cancels in FlashInfer's xqa and is NOT applied again. seq_lens include the draft tokens. The
    workspace is never written."""
    problem, batch = _xqa_prepare(dict(locals()))
    E.remember(xqa_batch_decode_with_kv_cache, router.execute(problem, batch, policy.explicit_choice()))
    return batch.out


def _xqa_prepare(a: dict):
    sig = E.signature("xqa", {k: v for k, v in a.items() if k not in _IGNORED}, loose=("block_tables",),
                      full=("sinks",), sizes=_SIZES)
    q = a["query"]

    def build(spec, d):
        spec_decode = spec.q_len_per_req > 1
        return _problem("xqa_batch_decode_with_kv_cache", q, d, phase="spec_decode" if spec_decode else "decode",
                        kv_storage="paged", kv_layout=spec.kv_layout, page_size=d.page_size,
                        causal=not spec_decode, window_left=spec.window_left,
                        mask="spec_bits" if spec_decode else "none", has_sinks=spec.sinks is not None,
                        q_len_per_req=spec.q_len_per_req if spec_decode and spec.q_cu_seq_lens is None else 0)

    problem, spec, d = E.checked(XqaDecodeSpec, a, sig, q.device, build)
    qlen = a["q_len_per_req"]
    qo = a["q_cu_seq_lens"] if a["q_cu_seq_lens"] is not None else uniform_indptr(d.batch, qlen, q.device)
    batch = AttentionBatch(
        q=q, k=d.k, v=d.v, qo_indptr=qo, kv_lens=a["seq_lens"],
        out=E.new_out(a["out"], d.total_q, d.hq, d.dvo, d.out_dtype, q.device), batch_size=d.batch,
        max_q_len=qlen, max_kv_len=a["max_seq_len"], sm_scale=a["bmm1_scale"], out_scale=a["bmm2_scale"],
        block_table=a["block_tables"], sinks=a["sinks"], spec_mask=a["mask"] if qlen > 1 else None)
    return problem, batch
