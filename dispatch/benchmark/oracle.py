"""The fp64 attention oracle: the one every test, tool, probe and ``attn-dispatch bench`` checks against.

Written only from the calling conventions, independent of every backend.

Source: FlashInfer's calling conventions (its documented API: the attention semantics, and
xqa's mask format). It deliberately shares no code with the backends
(in particular not backends/native/reference.py): its value is that it is a
second, straightforward reading of the contract.

One request at a time, dense (q_len x kv_len) scores in fp64:

* query row i of a request with L queries and S keys sits at position S - L + i
  (bottom-right alignment); key j sits at position j;
* causal keeps keys j <= pos_i; ``window_left`` >= 0 keeps keys j >= pos_i - window_left
  (inclusive: window_left + 1 keys including the query's own); without causal only
  that lower bound applies; an optional bool ``mask`` (L, S) keeps True entries;
* s = sm_scale * q.k, then the soft cap cap * tanh(s / cap) when cap > 0;
* sinks (Hq,) are raw logits that add exp(sink[h]) to the denominator (and nothing to the
  numerator: a value row of zeros);
* out = out_scale * softmax(s) @ v, lse = log2 of the softmax's whole denominator (base 2):
  log2(sum_k exp(s_k) + exp(sink)), the sink term included, as every vendor that returns an LSE
  with sinks computes it: FlashInfer 0.5.3's AttentionSink variants (flashinfer/jit/attention/
  variants.py L38-43 fa2 ``REGISTER_M_D_UPDATE`` folds the sink into m/d before prefill.cuh
  L2005-2008 writes log2(d) + m; L114-123 fa3 ``row_sum = row_max + log2(d_new)``), trtllm-gen's
  softmax stats (FlashInfer 0.5.3 csrc/fmhaReduction.cu L204-223: the sink joins the sum before
  the stats are stored) and cuDNN's Stats with ``sink_token`` (cudnn-frontend v1.16.0..v1.23.0
  include/cudnn_frontend/node/softmax.h: max(max, sink), sum + exp(sink - max), Stats = max +
  log(sum); its backward's dSink = sum(exp(sink - stats) * dO.O) needs exactly that); out =
  sum_k exp2(lse - ...) v_k holds with this LSE;
* a row with no kept key: out 0, lse -inf; with a sink, lse = sink / ln 2 (its denominator is
  the sink's exp alone, as in those vendors);
* GQA: q head h reads kv head h // (Hq / Hkv);
* ROPE_LLAMA: rotate-half (first half / second half pairs), frequency
  theta^(-2i/D) / rope_scale, q at its position S - L + i, k at j, before the dot.
ALiBi's slopes are not stated precisely enough in the conventions to be re-derived here:
a caller passes them (``alibi_slopes``) and the oracle adds slope * (key - query position), or
slope * (key - query row within its request) with ``alibi_query="row"`` (FlashInfer FA2 passes
the raw row index), before the soft cap. Without a soft cap the two give the same softmax and
the LSE moves by slope * (kv_len - q_len); with one, the cap sees the bias, so the output
differs too wherever kv_len != q_len.
fp8 outputs: ``stored_e4m3`` is what a kernel stores (rounded to nearest even, saturated at
+-448 as FlashInfer's kernels convert), ``e4m3_ulp`` the format's spacing at each value.

``reference_of_batch`` applies all of this to an ``AttentionBatch`` (paged or ragged K/V, the
problem's masks, sinks and scales) for the probe, the lab scenarios and the adapter tools.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

LN2 = math.log(2.0)
Scalar = Union[float, torch.Tensor]


def as_float(value: Scalar) -> float:
    """A float from a Python number or a 0-dim / 1-element tensor."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().double().reshape(-1)[0])
    return float(value)


def query_positions(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """Absolute positions of the query rows: bottom-right aligned."""
    return torch.arange(q_len, dtype=torch.int64, device=device) + (kv_len - q_len)


def allowed_keys(q_len: int, kv_len: int, causal: bool, window_left: int = -1,
                 mask: Optional[torch.Tensor] = None, device=None) -> torch.Tensor:
    """Bool (q_len, kv_len): which keys each query row may attend to."""
    pos = query_positions(q_len, kv_len, device)[:, None]
    key = torch.arange(kv_len, dtype=torch.int64, device=device)[None, :]
    keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        keep &= key <= pos
    if window_left >= 0:
        keep &= key >= pos - window_left
    if mask is not None:
        keep &= mask.to(device=keep.device, dtype=torch.bool).reshape(q_len, kv_len)
    return keep


def rope_llama(x: torch.Tensor, positions: torch.Tensor, rope_scale: float, rope_theta: float) -> torch.Tensor:
    """Rotate-half RoPE of x (n, H, D) in fp64 at the given (n,) positions."""
    dim = x.shape[-1]
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    freq = rope_theta ** (-2.0 * i / dim) / rope_scale
    angle = positions.to(device=x.device, dtype=torch.float64)[:, None] * freq[None, :]  # (n, half)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: Scalar,
                   causal: bool = False, window_left: int = -1, soft_cap: float = 0.0,
                   sinks: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
                   out_scale: Scalar = 1.0, pos_encoding: str = "NONE", rope_scale: float = 1.0,
                   rope_theta: float = 1e4, alibi_slopes: Optional[torch.Tensor] = None,
                   alibi_query: str = "position") -> tuple[torch.Tensor, torch.Tensor]:
    """One request. q (L, Hq, Dqk), k (S, Hkv, Dqk), v (S, Hkv, Dvo), real values (any dtype),
    computed on q's device. ``alibi_slopes`` (Hq,): the score gains slope[h] * (key - query
    position), before the soft cap (given by the caller: the conventions do not fix the slopes).

    The last rows of a request alone (q[-n:], with its whole k and v) are the last n rows of
    the full answer: bottom-right alignment puts them at the same positions (``bench`` checks
    a sample of rows that way).

    Returns out (L, Hq, Dvo) fp64 and lse (L, Hq) fp64 base 2.
    """
    device = q.device
    q, k, v = q.double(), k.to(device).double(), v.to(device).double()
    q_len, hq, _ = q.shape
    kv_len, hkv, _ = v.shape
    if hq % hkv:
        raise ValueError(f"num_qo_heads={hq} is not a multiple of num_kv_heads={hkv}")
    if pos_encoding == "ROPE_LLAMA":
        q = rope_llama(q, query_positions(q_len, kv_len, device), rope_scale, rope_theta)
        k = rope_llama(k, torch.arange(kv_len, device=device), rope_scale, rope_theta)
    elif pos_encoding != "NONE":
        raise ValueError(f"pos_encoding={pos_encoding!r}: the oracle states only NONE and ROPE_LLAMA")
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)  # q head h -> kv head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("lhd,shd->hls", q, k) * as_float(sm_scale)
    if alibi_slopes is not None:
        origin = query_positions(q_len, kv_len, device) if alibi_query == "position" else torch.arange(q_len, device=device)
        distance = torch.arange(kv_len, device=device)[None, :] - origin[:, None]
        scores = scores + alibi_slopes.to(device).double()[:, None, None] * distance[None].double()
    if soft_cap > 0:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    keep = allowed_keys(q_len, kv_len, causal, window_left, mask, device)
    scores = scores.masked_fill(~keep[None], -math.inf)
    return _softmax_out(scores, v, sinks, as_float(out_scale))


def _softmax_out(scores: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor],
                 out_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Hq, L, S) with -inf where masked -> out (L, Hq, Dvo), lse (L, Hq) base 2."""
    hq, q_len, _ = scores.shape
    row_max = scores.amax(dim=-1) if scores.shape[-1] else torch.full((hq, q_len), -math.inf, dtype=torch.float64,
                                                                       device=scores.device)
    if sinks is not None:
        sink = sinks.to(scores.device).double().reshape(hq, 1).expand(hq, q_len)
        row_max = torch.maximum(row_max, sink)
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = torch.exp(scores - safe_max[..., None])  # exp(-inf) = 0 for masked keys
    key_sum = probs.sum(dim=-1)
    denom = key_sum + torch.exp(sink - safe_max) if sinks is not None else key_sum
    weighted = torch.einsum("hls,shd->hld", probs, v)
    out = torch.where(key_sum[..., None] == 0, torch.zeros_like(weighted),
                      weighted / denom.clamp_min(1e-300)[..., None])
    lse = torch.where(denom == 0, torch.full_like(denom, -math.inf),  # the sink's term included
                      (safe_max + torch.log(denom.clamp_min(1e-300))) / LN2)
    return (out * out_scale).permute(1, 0, 2).contiguous(), lse.transpose(0, 1).contiguous()


def batch_attention_fp64(qs: Sequence[torch.Tensor], ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor],
                         masks: Optional[Sequence[Optional[torch.Tensor]]] = None,
                         **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Requests packed along dim 0 (request-major): (total_q, Hq, Dvo) and (total_q, Hq)."""
    outs, lses = [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        mask = masks[b] if masks is not None else None
        out, lse = attention_fp64(q, k, v, mask=mask, **kwargs)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=0)


# --- a whole AttentionBatch ----------------------------------------------------------------


def request_kv(batch, b: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (kv_len, Hkv, D) of request b: through its block-table row when the batch is
    paged (k/v as logical (pages, page_size, Hkv, D) views), else rows kv_indptr[b]: of k/v; NVFP4
    K/V (k_sf/v_sf given) dequantized (``nvfp4_fp64``)."""
    if batch.block_table is not None:
        page = batch.k.shape[1]
        pages = batch.block_table[b, : -(-kv_len // page)].long().to(batch.k.device)
        v_table = getattr(batch, "v_block_table", None)  # V's page ids of their own (TensorRT-LLM's form)
        v_pages = pages if v_table is None else v_table[b, : -(-kv_len // page)].long().to(batch.k.device)

        def rows(x: torch.Tensor, ids: torch.Tensor = pages) -> torch.Tensor:
            return x[ids].reshape(-1, *x.shape[2:])[:kv_len]
    else:
        start, v_pages = int(batch.kv_indptr[b]), None

        def rows(x: torch.Tensor, ids=None) -> torch.Tensor:
            return x[start:start + kv_len]
    if getattr(batch, "k_sf", None) is not None:
        k, v = (rows(batch.k), rows(batch.k_sf)), (rows(batch.v, v_pages), rows(batch.v_sf, v_pages))
        return nvfp4_fp64(*k), nvfp4_fp64(*v)
    return rows(batch.k), rows(batch.v, v_pages)


def nvfp4_fp64(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """NVFP4 values (FlashInfer's kv_cache_sf format) in fp64: packed (..., D/2) uint8, two fp4 e2m1
    values a byte (element 2i in the low nibble: sign bit 3, exponent 2 bits, mantissa 1 bit), times
    their block's fp8 e4m3 scale factor (..., D/16), one per 16 values (float8_e4m3fn or its bytes)."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).to(torch.int64)
    e, m = (codes >> 1) & 3, (codes & 1).double()
    mag = torch.where(e == 0, m / 2, (1 + m / 2) * torch.exp2((e - 1).double()))
    values = torch.where((codes & 8) != 0, -mag, mag)
    scale = (sf if sf.dtype == torch.float8_e4m3fn else sf.view(torch.float8_e4m3fn)).double()
    return (values.unflatten(-1, (-1, 16)) * scale.unsqueeze(-1)).flatten(-2)


def request_mask(problem, batch, b: int, q_len: int, kv_len: int) -> Optional[torch.Tensor]:
    """The (q_len, kv_len) bool mask a batch carries for request b (custom or xqa spec bits), or None."""
    if problem.mask == "custom":
        start = int(batch.mask_indptr[b]) if batch.mask_indptr is not None else 0
        return batch.custom_mask.reshape(-1)[start:start + q_len * kv_len].reshape(q_len, kv_len)
    if problem.mask == "spec_bits":
        q0 = int(batch.qo_indptr[b])
        rows = batch.spec_mask[b, :q_len] if batch.spec_mask.dim() == 3 else batch.spec_mask[q0:q0 + q_len]
        return spec_decode_mask(unpack_spec_bits(rows, q_len), kv_len)
    return None


def reference_of_batch(problem, batch, masks: Optional[Sequence[Optional[torch.Tensor]]] = None,
                       alibi_slopes: Optional[torch.Tensor] = None, alibi_query: str = "row",
                       device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 (total_q, Hq, Dvo) out and (total_q, Hq) base-2 LSE of an AttentionBatch under its
    AttentionProblem: causal (replaced by a custom or spec mask, as in FlashInfer), window, soft
    cap, sinks, sm_scale / out_scale, RoPE; ``masks`` (one per request) override the batch's own;
    ALiBi needs ``alibi_slopes`` (Hq,). Computed on ``device`` (default: q's)."""
    device = device or batch.q.device
    qo, kv_lens = batch.qo_indptr.tolist(), batch.kv_lens.tolist()
    sinks = batch.sinks if problem.has_sinks else None
    outs, lses = [], []
    for b in range(batch.batch_size):
        q_len, kv_len = qo[b + 1] - qo[b], int(kv_lens[b])
        k, v = request_kv(batch, b, kv_len)
        mask = masks[b] if masks is not None else request_mask(problem, batch, b, q_len, kv_len)
        out, lse = attention_fp64(
            batch.q[qo[b]:qo[b + 1]].to(device), k, v, sm_scale=batch.sm_scale,
            causal=problem.causal and problem.mask == "none", window_left=problem.window_left,
            soft_cap=problem.logits_soft_cap, sinks=sinks, mask=mask, out_scale=batch.out_scale,
            pos_encoding="ROPE_LLAMA" if problem.pos_encoding == "ROPE_LLAMA" else "NONE",
            rope_scale=problem.rope_scale, rope_theta=problem.rope_theta,
            alibi_slopes=alibi_slopes if problem.pos_encoding == "ALIBI" else None, alibi_query=alibi_query)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


# --- mask formats (conventions 2.3 / 2.4) --------------------------------------------------


def spec_decode_mask(draft_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """(L, S) bool from an xqa draft mask (L, L): the KV prefix (S - L keys) is always visible."""
    q_len = draft_mask.shape[0]
    full = torch.ones(q_len, kv_len, dtype=torch.bool, device=draft_mask.device)
    full[:, kv_len - q_len:] = draft_mask.to(torch.bool)
    return full


def pack_spec_bits(rows: torch.Tensor, width_bits: int) -> torch.Tensor:
    """Bool (..., n) -> uint16 (..., 2 * ceil(width_bits / 32)): little-endian uint32 words
    (bit j % 32 of word j // 32 set when entry j is True), each viewed as two uint16."""
    n_words = -(-width_bits // 32)
    padded = torch.zeros(*rows.shape[:-1], n_words * 32, dtype=torch.int64)
    padded[..., : rows.shape[-1]] = rows.to(torch.int64)
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    words = (padded.reshape(*rows.shape[:-1], n_words, 32) * weights).sum(-1)
    low, high = words & 0xFFFF, (words >> 16) & 0xFFFF
    halves = torch.stack([low, high], dim=-1).reshape(*rows.shape[:-1], 2 * n_words)
    return halves.to(torch.int32).to(torch.uint16)


def unpack_spec_bits(words: torch.Tensor, width: int) -> torch.Tensor:
    """uint16 (..., W) xqa bit rows -> bool (..., width): entry j is bit j % 16 of uint16 j // 16
    (little-endian uint32 words seen as uint16 pairs), the inverse of ``pack_spec_bits``."""
    j = torch.arange(width, device=words.device)
    halves = (words.view(torch.int16).to(torch.int32) & 0xFFFF)[..., j // 16]
    return ((halves >> (j % 16)) & 1).to(torch.bool)


def packbits_little(flat: torch.Tensor) -> torch.Tensor:
    """numpy.packbits(bitorder='little') of a flat bool tensor, as uint8."""
    n = flat.numel()
    padded = torch.zeros(-(-n // 8) * 8, dtype=torch.int64)
    padded[:n] = flat.reshape(-1).to(torch.int64)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.int64)
    return (padded.reshape(-1, 8) * weights).sum(-1).to(torch.uint8)


# --- agreement ------------------------------------------------------------------------------
E4M3_MAX = 448.0


def stored_e4m3(values: torch.Tensor) -> torch.Tensor:
    """fp64 values as an fp8 e4m3 output stores them, back in fp64: rounded to nearest even and
    saturated at +-448 (FlashInfer's XQA converts with satfinite; the clamp keeps that whatever a torch
    release's own overflow rule)."""
    return values.double().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double()


def e4m3_ulp(values: torch.Tensor) -> torch.Tensor:
    """The spacing of fp8 e4m3 values at each value's magnitude: 2^(e - 3) in [2^e, 2^(e+1)), 2^-9
    below 2^-6 (the subnormals); past 448, the spacing at 448."""
    magnitude = values.double().abs().clamp(2.0 ** -6, E4M3_MAX)
    return torch.exp2(torch.floor(torch.log2(magnitude)) - 3)


def e4m3_ulps_off(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest distance, in e4m3 spacings at the reference, between an fp8 output and the fp64
    reference as stored (``stored_e4m3``): 0 when every element is the reference's rounding, 1 when a
    computation error moved some across a rounding boundary; inf with a NaN."""
    got, ref = got.double().to(ref.device), ref.double()
    if torch.isnan(got).any():
        return math.inf
    return float(((got - stored_e4m3(ref)).abs() / e4m3_ulp(ref)).max()) if ref.numel() else 0.0


# Relative Frobenius error bands by the dtype the inputs were stored in (METHOD): bf16/fp16 land
# at 1e-3..1e-2, fp8 KV near 3e-2, fp32 well below 1e-3.
BANDS = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "fp8": 6e-2}


def band(q_dtype: str, kv_dtype: str) -> float:
    """The agreement band of a problem stored in these dtypes (names as in AttentionProblem)."""
    return BANDS["fp8"] if kv_dtype.startswith("float8") else BANDS.get(q_dtype, BANDS["bfloat16"])


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| (Frobenius, fp64) over the reference's finite entries; inf when got
    has a NaN (an unwritten, poisoned element) or is finite where the reference is not."""
    got, ref = got.double().to(ref.device), ref.double()
    if torch.isnan(got).any():
        return math.inf
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(got)):
        return math.inf
    num = torch.linalg.vector_norm(got[finite] - ref[finite])
    return float(num / torch.linalg.vector_norm(ref[finite]).clamp_min(1e-300))
