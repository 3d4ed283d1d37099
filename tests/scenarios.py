"""Named scenarios: inputs for the PUBLIC entry points in their native calling conventions.

Each scenario is ``function(entry, dtype, seed) -> Case``; a Case unpacks as
``call, expected = case`` (``call()`` runs the entry point through ``import dispatch``;
``expected`` is the fp64 oracle result in that entry's output convention) and also
carries what the agreement tests check besides values: the NaN-poisoned buffers the
entry must fill and return, the inputs that must be unchanged, buffers that must stay
zero (xqa workspace), and the tolerance class.

Entries (``ENTRIES``) and the conventions they follow (FlashInfer's documented signatures):
  cudnn       cudnn_batch_prefill_with_kv_cache (element offsets, (B,1,1,1) lengths, padded base-2 LSE)
  trtllm      trtllm_batch_context_with_kv_cache (5-D/tuple cache, default HND, seq_lens incl. new tokens)
  xqa         xqa_batch_decode_with_kv_cache (default NHD, spec-decode uint16 bit masks, q_cu_seq_lens)
  paged       BatchPrefillWithPagedKVCacheWrapper plan/run
  ragged      BatchPrefillWithRaggedKVCacheWrapper plan/run
  single      single_prefill_with_kv_cache (the first request of the scenario only)
  single_lse  single_prefill_with_kv_cache_return_lse
Shapes stay small (a few requests, <= 64 keys) so CPU CI and the Triton interpreter can run them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from oracle import as_float, batch_attention_fp64, pack_spec_bits, packbits_little, spec_decode_mask

ENTRIES = ("cudnn", "trtllm", "xqa", "paged", "ragged", "single", "single_lse")
PREFILL = ("cudnn", "trtllm", "paged", "ragged", "single", "single_lse")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
FP8 = torch.float8_e4m3fn
HALF = ("fp16", "bf16")
WORKSPACE_BYTES = 1 << 16


@dataclass
class Setup:
    """What a scenario asks for; each entry builder renders it in its own convention."""

    q_lens: list
    kv_lens: list
    hq: int = 4
    hkv: int = 2
    dqk: int = 64
    dvo: Optional[int] = None  # None = dqk
    causal: bool = True
    window_left: int = -1
    soft_cap: float = 0.0
    sinks: bool = False
    mask: str = ""  # "", "custom", "custom_packed", "spec_causal", "spec_random"
    page_size: int = 16
    layout: Optional[str] = None  # None = the entry's default (not passed)
    cache_form: str = "5d"  # "5d" | "tuple" | "squeezed" (4-D, P=1) | "squeezed_tuple" (3-D, P=1)
    permute_pages: bool = False
    strided: bool = False
    want_lse: bool = False
    provide_out: bool = True
    sm_scale: Optional[float] = None  # None = the entry's default 1/sqrt(dqk) (not passed)
    scale_mode: str = ""  # "", "scales" (bmm1 0-dim tensor, bmm2 0.7 ...), "tensors" (both 0-dim)
    fp8_kv: bool = False
    pos_encoding: str = "NONE"
    variant: str = ""  # entry-specific: token_offsets, lens_1d, ragged, cum_kv_garbage, lse_buffer_only, q_cu

    @property
    def d_v(self) -> int:
        return self.dvo or self.dqk


@dataclass
class Expected:
    out: torch.Tensor  # fp64, shape and layout of the entry's output
    lse: Optional[torch.Tensor] = None  # fp64 base 2 in the entry's LSE layout, None if none is returned
    lse_rows: Optional[torch.Tensor] = None  # bool mask of LSE entries defined by the contract (cuDNN padding)


@dataclass
class Case:
    call: Callable[[], Any]
    expected: Expected
    unpack: Callable[[Any], tuple]  # raw result -> (out, lse or None)
    out_dtype: torch.dtype
    inputs: dict = field(default_factory=dict)  # name -> tensor that must be unchanged by the call
    out_buffer: Optional[torch.Tensor] = None  # NaN-poisoned, must be filled and returned as is
    lse_buffer: Optional[torch.Tensor] = None
    zero_buffers: dict = field(default_factory=dict)  # must still be all zero after the call
    fp8: bool = False

    def __iter__(self):
        yield self.call
        yield self.expected


# --- random data -------------------------------------------------------------------------


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def _stored(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored tensor, its real fp64 value): fp8 stores x / scale and dequantizes by scale."""
    stored = (x / scale).to(dtype) if dtype == FP8 else x.to(dtype)
    return stored, stored.double() * scale


def _strided_copy(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The same values as an x[..., :D] view of a buffer twice as wide (random, never zero, padding)."""
    buf = _randn(gen, *x.shape[:-1], 2 * x.shape[-1]).to(x.dtype)
    buf[..., : x.shape[-1]] = x
    return buf[..., : x.shape[-1]]


def _indptr(lens) -> torch.Tensor:
    return torch.tensor([0] + list(_cumsum(lens)), dtype=torch.int32)


def _cumsum(lens):
    total = 0
    for n in lens:
        total += n
        yield total


def _poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.float32).to(dtype)


@dataclass
class Data:
    """Per-request real values (fp64) plus the stored packed query."""

    q: torch.Tensor  # stored (total_q, Hq, Dqk)
    q_real: list
    k_real: list
    v_real: list
    masks: list  # per request bool (L, S) or None, for the oracle
    sinks: Optional[torch.Tensor]
    k_scale: float = 1.0
    v_scale: float = 1.0
    q_scale: float = 1.0
    extra: dict = field(default_factory=dict)


def _queries(s: Setup, gen, q_dtype) -> tuple[torch.Tensor, list, float]:
    q_scale = 0.05 if q_dtype == FP8 else 1.0
    q_all = _randn(gen, sum(s.q_lens), s.hq, s.dqk)
    q, real = _stored(q_all, q_dtype, q_scale)
    return q, list(real.split(list(s.q_lens))), q_scale


def _masks(s: Setup, gen) -> list:
    """Per-request bool (L, S) masks for custom/spec scenarios (None otherwise)."""
    out = []
    for b, (ql, kl) in enumerate(zip(s.q_lens, s.kv_lens)):
        if s.mask in ("custom", "custom_packed"):
            m = torch.rand(ql, kl, generator=gen) < 0.6
            if b == 0 and ql > 1:
                m[0] = False  # a fully masked row: out 0, lse -inf
            out.append(m)
        elif s.mask.startswith("spec"):
            draft = torch.tril(torch.ones(ql, ql, dtype=torch.bool))
            if s.mask == "spec_random":
                draft = (torch.rand(ql, ql, generator=gen) < 0.5) | torch.eye(ql, dtype=torch.bool)
            out.append(draft)
        else:
            out.append(None)
    return out


def _oracle_masks(s: Setup, data: Data) -> list:
    if s.mask.startswith("spec"):
        return [spec_decode_mask(d, kl) for d, kl in zip(data.masks, s.kv_lens)]
    return data.masks


def expected_packed(s: Setup, data: Data, sm_scale: float, out_scale: float) -> tuple:
    """The oracle's (total_q, Hq, Dvo) out and (total_q, Hq) lse for the setup."""
    causal = s.causal and not s.mask.startswith("spec")
    return batch_attention_fp64(
        data.q_real, data.k_real, data.v_real, _oracle_masks(s, data), sm_scale=sm_scale, causal=causal,
        window_left=s.window_left, soft_cap=s.soft_cap, sinks=data.sinks, out_scale=out_scale,
        pos_encoding=s.pos_encoding)


# --- paged KV --------------------------------------------------------------------------


@dataclass
class Paged:
    k_pages: torch.Tensor  # stored, logical NHD (pages, P, Hkv, D)
    v_pages: torch.Tensor
    block_table: torch.Tensor  # (B, max_pages) int32, tails random valid ids
    page_ids: list  # per request list of page ids


def make_paged(s: Setup, gen, data: Data, kv_dtype) -> Paged:
    """A page pool with random garbage everywhere, requests' pages sequential or permuted."""
    P = s.page_size
    counts = [max(1, -(-kl // P)) for kl in s.kv_lens]
    num_pages = sum(counts) + 2  # spare pages full of garbage
    order = torch.randperm(num_pages, generator=gen) if s.permute_pages else torch.arange(num_pages)
    ids, start = [], 0
    for c in counts:
        ids.append(order[start:start + c].tolist())
        start += c
    k_st, k_real = _stored(_randn(gen, num_pages, P, s.hkv, s.dqk), kv_dtype, data.k_scale)
    v_st, v_real = _stored(_randn(gen, num_pages, P, s.hkv, s.d_v), kv_dtype, data.v_scale)
    max_pages = max(counts) + 1
    table = torch.randint(0, num_pages, (len(counts), max_pages), generator=gen, dtype=torch.int32)
    for b, (pid, kl) in enumerate(zip(ids, s.kv_lens)):
        table[b, : len(pid)] = torch.tensor(pid, dtype=torch.int32)
        data.k_real.append(k_real[pid].reshape(-1, s.hkv, s.dqk)[:kl])
        data.v_real.append(v_real[pid].reshape(-1, s.hkv, s.d_v)[:kl])
    return Paged(k_st, v_st, table, ids)


def paged_cache(s: Setup, pg: Paged, layout: str, gen):
    """The caller's cache object: 5-D (pages, 2, ...) or a (K, V) tuple, NHD or HND, maybe strided."""
    k, v = pg.k_pages, pg.v_pages
    if s.cache_form.startswith("squeezed"):  # page size 1 with the P dim squeezed
        k, v = k[:, 0], v[:, 0]
        return torch.stack([k, v], 1) if s.cache_form == "squeezed" else (k.contiguous(), v.contiguous())
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    if s.cache_form == "5d":
        cache = torch.stack([k, v], 1)
        return _strided_copy(cache, gen) if s.strided else cache
    k, v = k.contiguous(), v.contiguous()
    return (_strided_copy(k, gen), _strided_copy(v, gen)) if s.strided else (k, v)


def _prepare(s: Setup, gen, q_dtype, kv_dtype) -> Data:
    q, q_real, q_scale = _queries(s, gen, q_dtype)
    sinks = torch.rand(s.hq, generator=gen) * 5 if s.sinks else None
    data = Data(q, q_real, [], [], _masks(s, gen), sinks, q_scale=q_scale)
    if kv_dtype == FP8:
        data.k_scale, data.v_scale = 0.25, 0.5
    return data


def _ragged_kv(s: Setup, gen, data: Data, kv_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    k, k_real = _stored(_randn(gen, sum(s.kv_lens), s.hkv, s.dqk), kv_dtype, data.k_scale)
    v, v_real = _stored(_randn(gen, sum(s.kv_lens), s.hkv, s.d_v), kv_dtype, data.v_scale)
    data.k_real.extend(k_real.split(list(s.kv_lens)))
    data.v_real.extend(v_real.split(list(s.kv_lens)))
    return k, v


def _packed_views(gen, *tensors):
    """Tensors (n, H_i, D_i) with equal n as column slices of one packed buffer (token stride > H*D)."""
    n = tensors[0].shape[0]
    widths = [t.shape[1] * t.shape[2] for t in tensors]
    buf = _randn(gen, n, sum(widths) + 8).to(tensors[0].dtype)
    views, col = [], 0
    for t, w in zip(tensors, widths):
        buf[:, col:col + w] = t.reshape(n, w)
        views.append(buf[:, col:col + w].view(n, t.shape[1], t.shape[2]))
        col += w
    return views


def _scale(value: float, as_tensor: bool):
    return torch.tensor(value, dtype=torch.float32) if as_tensor else value


def _out_buffer(s: Setup, data: Data, dtype) -> Optional[torch.Tensor]:
    return _poisoned((data.q.shape[0], s.hq, s.d_v), dtype) if s.provide_out else None


def _lse_buffer(s: Setup, data: Data) -> Optional[torch.Tensor]:
    return _poisoned((data.q.shape[0], s.hq), torch.float32) if s.want_lse else None


def _tuple_result(returns_lse: bool):
    return (lambda r: (r[0], r[1])) if returns_lse else (lambda r: (r, None))


# --- entry builders ------------------------------------------------------------------------


def _default_sm(s: Setup) -> float:
    return s.sm_scale if s.sm_scale is not None else 1.0 / math.sqrt(s.dqk)


def _wrapper_scales(s: Setup, data: Data) -> tuple[dict, float, float]:
    """run() k_scale/v_scale, and the oracle's (sm_scale, out_scale) on real values."""
    extra_k, extra_v = (0.8, 0.7) if s.scale_mode else (1.0, 1.0)
    kw = {}
    if s.fp8_kv or s.scale_mode:
        kw = {"k_scale": data.k_scale * extra_k, "v_scale": data.v_scale * extra_v}
    return kw, _default_sm(s) * extra_k, extra_v


def _plan_kwargs(s: Setup, dtype, data: Data) -> dict:
    kw: dict = {"causal": s.causal}
    if s.dvo:
        kw["head_dim_vo"] = s.dvo
    if s.mask == "custom":
        kw["custom_mask"] = torch.cat([m.reshape(-1) for m in data.masks])
    elif s.mask == "custom_packed":
        kw["packed_custom_mask"] = torch.cat([packbits_little(m.reshape(-1)) for m in data.masks])
    optional = {"pos_encoding_mode": (s.pos_encoding, "NONE"), "window_left": (s.window_left, -1),
                "logits_soft_cap": (s.soft_cap, 0.0), "sm_scale": (s.sm_scale, None)}
    kw.update({name: value for name, (value, default) in optional.items() if value != default})
    if dtype != torch.float16:  # float16 is plan's default q_data_type: rely on it
        kw["q_data_type"] = dtype
    if s.fp8_kv:
        kw["kv_data_type"] = FP8
    return kw


def _run_kwargs(s: Setup, data: Data, out, lse, scale_kw: dict) -> dict:
    kw = dict(scale_kw)
    if out is not None:
        kw["out"] = out
    if s.want_lse:
        kw.update(lse=lse, return_lse=True)
    return kw


def _tensor_inputs(**named) -> dict:
    found = {}
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            found[name] = value
        elif isinstance(value, (tuple, list)):
            found.update({f"{name}[{i}]": t for i, t in enumerate(value) if isinstance(t, torch.Tensor)})
        elif isinstance(value, dict):
            found.update(_tensor_inputs(**{f"{name}.{k}": t for k, t in value.items()}))
    return found


def _wrapper_case(s, dtype, data, call, args, plan_kw, run_kw, out, lse) -> Case:
    run_inputs = {k: v for k, v in run_kw.items() if k not in ("out", "lse")}
    exp_out, exp_lse = expected_packed(s, data, data.extra["sm"], data.extra["out_scale"])
    return Case(call, Expected(exp_out, exp_lse if s.want_lse else None), _tuple_result(s.want_lse), dtype,
                _tensor_inputs(args=args, plan=plan_kw, run=run_inputs), out, lse, fp8=s.fp8_kv)


def build_ragged(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    data = _prepare(s, gen, dtype, dtype)
    k, v = _ragged_kv(s, gen, data, dtype)
    q = data.q
    if s.strided:  # q/k/v column slices of one packed QKV buffer (scenario uses q_len == kv_len)
        q, k, v = _packed_views(gen, q, k, v)
    qo, kv = _indptr(s.q_lens), _indptr(s.kv_lens)
    scale_kw, data.extra["sm"], data.extra["out_scale"] = _wrapper_scales(s, data)
    out, lse = _out_buffer(s, data, dtype), _lse_buffer(s, data)
    plan_kw, run_kw = _plan_kwargs(s, dtype, data), _run_kwargs(s, data, out, lse, scale_kw)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.int8)

    def call():
        wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        wrapper.plan(qo, kv, s.hq, s.hkv, s.dqk, **plan_kw)
        return wrapper.run(q, k, v, **run_kw)

    return _wrapper_case(s, dtype, data, call, (q, k, v, qo, kv), plan_kw, run_kw, out, lse)


def build_paged(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    kv_dtype = FP8 if s.fp8_kv else dtype
    data = _prepare(s, gen, dtype, kv_dtype)
    pg = make_paged(s, gen, data, kv_dtype)
    cache = paged_cache(s, pg, s.layout or "NHD", gen)
    q = _strided_copy(data.q, gen) if s.strided else data.q
    qo = _indptr(s.q_lens)
    kv_indptr = _indptr([len(p) for p in pg.page_ids])
    indices = torch.tensor([i for p in pg.page_ids for i in p], dtype=torch.int32)
    last = torch.tensor([(kl - 1) % s.page_size + 1 for kl in s.kv_lens], dtype=torch.int32)
    scale_kw, data.extra["sm"], data.extra["out_scale"] = _wrapper_scales(s, data)
    out, lse = _out_buffer(s, data, dtype), _lse_buffer(s, data)
    plan_kw, run_kw = _plan_kwargs(s, dtype, data), _run_kwargs(s, data, out, lse, scale_kw)
    if data.sinks is not None:
        run_kw["sinks"] = data.sinks
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.int8)
    layout_args = (s.layout,) if s.layout else ()

    def call():
        wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws, *layout_args)
        wrapper.plan(qo, kv_indptr, indices, last, s.hq, s.hkv, s.dqk, s.page_size, **plan_kw)
        return wrapper.run(q, cache, **run_kw)

    return _wrapper_case(s, dtype, data, call, (q, cache, qo, kv_indptr, indices, last), plan_kw, run_kw, out, lse)


def build_single(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    s = replace(s, q_lens=s.q_lens[:1], kv_lens=s.kv_lens[:1])
    data = _prepare(s, gen, dtype, dtype)
    k, v = _ragged_kv(s, gen, data, dtype)
    q = data.q
    if s.strided:
        same_len = q.shape[0] == k.shape[0]
        q, k, v = _packed_views(gen, q, k, v) if same_len else (*_packed_views(gen, q), *_packed_views(gen, k, v))
    if s.layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    kw = _plan_kwargs(s, dtype, data)
    kw.pop("q_data_type", None)
    if "custom_mask" in kw:
        kw["custom_mask"] = data.masks[0]  # single takes the (qo_len, kv_len) bool matrix
    if s.layout:
        kw["kv_layout"] = s.layout
    returns_lse = entry == "single_lse" or s.want_lse
    if entry == "single" and s.want_lse:
        kw["return_lse"] = True
    fn = (dispatch.single_prefill_with_kv_cache if entry == "single"
          else dispatch.single_prefill_with_kv_cache_return_lse)
    exp_out, exp_lse = expected_packed(s, data, _default_sm(s), 1.0)
    return Case(lambda: fn(q, k, v, **kw), Expected(exp_out, exp_lse if returns_lse else None),
                _tuple_result(returns_lse), dtype, _tensor_inputs(q=q, k=k, v=v, kw=kw))


def _bmm_scales(s: Setup, data: Data) -> tuple:
    """(bmm1, bmm2) as passed, and the oracle's (sm_scale, out_scale) on real values."""
    sm = _default_sm(s)
    extra_v = 0.7 if s.scale_mode else 1.0
    bmm1 = _scale(data.q_scale * data.k_scale * sm, bool(s.scale_mode))
    bmm2 = _scale(data.v_scale * extra_v, s.scale_mode == "tensors")
    oracle_sm = as_float(bmm1) / (data.q_scale * data.k_scale)
    oracle_out = as_float(bmm2) / data.v_scale
    return bmm1, bmm2, oracle_sm, oracle_out


def build_trtllm(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    kv_dtype = FP8 if s.fp8_kv else dtype
    data = _prepare(s, gen, kv_dtype, kv_dtype)  # fp8 KV comes with an fp8 query (as upstream's grid)
    pg = make_paged(s, gen, data, kv_dtype)
    cache = paged_cache(s, pg, s.layout or "HND", gen)
    q = _strided_copy(data.q, gen) if s.strided else data.q
    seq_lens = torch.tensor(s.kv_lens, dtype=torch.int32)
    cum_q = _indptr(s.q_lens)
    cum_kv = _indptr([len(p) for p in pg.page_ids])  # page counts, as upstream tests pass: ignored
    if s.variant == "cum_kv_garbage":
        cum_kv = torch.arange(pg.k_pages.shape[0] + 1, dtype=torch.int32) * s.page_size
    bmm1, bmm2, sm, out_scale = _bmm_scales(s, data)
    out, lse = _out_buffer(s, data, dtype), _lse_buffer(s, data)
    kw = {"out": out} if out is not None else {}
    kw.update({k: v for k, v in (("kv_layout", s.layout), ("sinks", data.sinks), ("lse", lse)) if v is not None})
    if kv_dtype == FP8:
        kw["out_dtype"] = dtype
    if not s.causal:
        kw["causal"] = False
    returns_lse = s.want_lse and s.variant != "lse_buffer_only"
    if returns_lse:
        kw["return_lse"] = True
    args = (q, cache, torch.empty(WORKSPACE_BYTES, dtype=torch.int8), pg.block_table, seq_lens, max(s.q_lens),
            max(s.kv_lens), bmm1, bmm2, len(s.q_lens), cum_q, cum_kv, s.window_left)
    exp_out, exp_lse = expected_packed(s, data, sm, out_scale)
    unpack = _tuple_result(True) if returns_lse else (lambda r: (r, lse))
    return Case(lambda: dispatch.trtllm_batch_context_with_kv_cache(*args, **kw),
                Expected(exp_out, exp_lse if s.want_lse else None), unpack, dtype,
                _tensor_inputs(args=args[:2] + args[3:], kw={k: v for k, v in kw.items() if k not in ("out", "lse")}),
                out, lse, fp8=s.fp8_kv)


def _xqa_mask(s: Setup, data: Data) -> Optional[torch.Tensor]:
    """uint16 bit rows: (B, q_len, 2*ceil(q_len/32)) or ragged (total_q, 2*ceil(max_q/32))."""
    if not s.mask.startswith("spec"):
        return None
    width = max(s.q_lens)
    if s.variant != "q_cu":
        return pack_spec_bits(torch.stack(data.masks), width)
    rows = torch.zeros(sum(s.q_lens), width, dtype=torch.bool)
    for b, draft in enumerate(data.masks):
        start = sum(s.q_lens[:b])
        rows[start:start + s.q_lens[b], : s.q_lens[b]] = draft
    return pack_spec_bits(rows, width)


def build_xqa(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    kv_dtype = FP8 if s.fp8_kv else dtype
    data = _prepare(s, gen, dtype, kv_dtype)
    pg = make_paged(s, gen, data, kv_dtype)
    cache = paged_cache(s, pg, s.layout or "NHD", gen)
    bmm1, bmm2, sm, out_scale = _bmm_scales(s, data)
    out = _out_buffer(s, data, dtype)
    mask = _xqa_mask(s, data)
    kw = {k: v for k, v in (("out", out), ("sinks", data.sinks), ("kv_layout", s.layout), ("mask", mask))
          if v is not None}
    if max(s.q_lens) > 1 or s.variant == "q_cu":
        kw["q_len_per_req"] = max(s.q_lens)
    if s.variant == "q_cu":
        kw["q_cu_seq_lens"] = _indptr(s.q_lens)
    if s.scale_mode:
        kw["o_scale"] = 2.0  # cancels inside xqa: the output multiplier stays bmm2_scale
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.int8)
    args = (data.q, cache, ws, pg.block_table, torch.tensor(s.kv_lens, dtype=torch.int32), max(s.kv_lens),
            bmm1, bmm2, s.window_left)
    exp_out, _ = expected_packed(s, data, sm, out_scale)
    return Case(lambda: dispatch.xqa_batch_decode_with_kv_cache(*args, **kw), Expected(exp_out), lambda r: (r, None),
                dtype, _tensor_inputs(args=args[:2] + args[3:], kw={k: v for k, v in kw.items() if k != "out"}),
                out, None, {"workspace_buffer": ws}, fp8=s.fp8_kv)


def _cudnn_pages(s: Setup, pg: Paged, gen) -> tuple:
    """(pages, Hkv, P, D) logical views; physical memory per the scenario (cuDNN ignores kv_layout)."""
    k, v = pg.k_pages.transpose(1, 2), pg.v_pages.transpose(1, 2)  # HND-shaped views of NHD memory
    if s.layout == "NHD":
        return k, v
    if s.cache_form == "5d" and s.layout == "HND":
        both = torch.stack([k, v], 1).contiguous()  # a true-HND 5-D cache, K = [:, 0], V = [:, 1]
        return both[:, 0], both[:, 1]
    k, v = k.contiguous(), v.contiguous()
    return (_strided_copy(k, gen), _strided_copy(v, gen)) if s.strided else (k, v)


def _cudnn_offsets(s: Setup, paged: bool) -> dict:
    q_tok, kv_tok = _indptr(s.q_lens), _indptr(s.kv_lens)
    if s.variant == "token_offsets":
        kw = {"batch_offsets_q": q_tok, "batch_offsets_units": "tokens"}
        return kw if paged else {**kw, "batch_offsets_k": kv_tok}
    kw = {"batch_offsets_q": q_tok * s.hq * s.dqk, "batch_offsets_o": q_tok * s.hq * s.d_v}
    if not paged:
        kw.update(batch_offsets_k=kv_tok * s.hkv * s.dqk, batch_offsets_v=kv_tok * s.hkv * s.d_v)
    return kw


def _cudnn_lse(s: Setup, exp_lse: torch.Tensor, max_tok: int) -> tuple:
    """Padded (B, max_token_per_sequence, Hq) base-2 LSE and the mask of its defined rows."""
    padded = torch.full((len(s.q_lens), max_tok, s.hq), -math.inf, dtype=torch.float64)
    rows = torch.zeros(len(s.q_lens), max_tok, s.hq, dtype=torch.bool)
    for b, (part, ql) in enumerate(zip(exp_lse.split(list(s.q_lens)), s.q_lens)):
        padded[b, :ql], rows[b, :ql] = part, True
    return padded, rows


def build_cudnn(s: Setup, gen, dtype, entry) -> Case:
    import dispatch

    if s.dqk == 64:
        s = replace(s, dqk=128)  # cuDNN's documented head dims: 128 (and 192/128)
    data = _prepare(s, gen, dtype, dtype)
    paged = not (s.variant == "ragged" or s.dvo)
    if paged:
        pg = make_paged(s, gen, data, dtype)
        k, v = _cudnn_pages(s, pg, gen)
    else:
        k, v = _ragged_kv(s, gen, data, dtype)
    b = len(s.q_lens)
    max_tok, max_kv = max(s.q_lens) + 2, max(s.kv_lens) + 3  # upper bounds, not the real maxima
    lens_shape = (b,) if s.variant == "lens_1d" else (b, 1, 1, 1)
    kw = dict(max_token_per_sequence=max_tok, max_sequence_kv=max_kv, causal=s.causal, return_lse=s.want_lse,
              actual_seq_lens_q=torch.tensor(s.q_lens, dtype=torch.int32).reshape(lens_shape),
              actual_seq_lens_kv=torch.tensor(s.kv_lens, dtype=torch.int32).reshape(lens_shape),
              **_cudnn_offsets(s, paged))
    if paged:
        kw["block_tables"] = pg.block_table
    out = _out_buffer(s, data, dtype)
    lse = _poisoned((b, max_tok, s.hq), torch.float32) if s.want_lse and s.provide_out else None
    kw.update({k_: v_ for k_, v_ in (("out", out), ("lse", lse)) if v_ is not None})
    scale = _default_sm(s)
    exp_out, exp_lse = expected_packed(s, data, scale, 1.0)
    padded, rows = _cudnn_lse(s, exp_lse, max_tok) if s.want_lse else (None, None)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.int8)
    return Case(lambda: dispatch.cudnn_batch_prefill_with_kv_cache(data.q, k, v, scale, ws, **kw),
                Expected(exp_out, padded, rows), lambda r: (r[0], r[1]), dtype,
                _tensor_inputs(q=data.q, k=k, v=v, kw={k_: v_ for k_, v_ in kw.items() if k_ not in ("out", "lse")}),
                out, lse)


BUILDERS = {"cudnn": build_cudnn, "trtllm": build_trtllm, "xqa": build_xqa, "paged": build_paged,
            "ragged": build_ragged, "single": build_single, "single_lse": build_single}


def build(entry: str, setup: Setup, dtype: str, seed: int) -> Case:
    """Render a Setup for one entry point with fresh random inputs (seeded)."""
    if entry not in BUILDERS:
        raise ValueError(f"entry={entry!r}: allowed {', '.join(BUILDERS)}")
    gen = torch.Generator().manual_seed(seed)
    return BUILDERS[entry](setup, gen, DTYPES[dtype], entry)


# --- the named scenarios -------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    fn: Callable[[str, str, int], Case]
    dtypes: dict  # entry -> tuple of dtype names

    def __call__(self, entry: str, dtype: str, seed: int) -> Case:
        return self.fn(entry, dtype, seed)


SCENARIOS: dict = {}


FP32_ENTRIES = ("paged", "ragged", "single", "single_lse")  # fp32 runs where FlashInfer-native APIs sit


def scenario(entries, dtypes=("bf16",), fp32=False):
    """Register a scenario for entries x dtypes (plus fp32 on FP32_ENTRIES when fp32=True)."""
    def register(fn):
        table = {e: tuple(dtypes) + (("fp32",) if fp32 and e in FP32_ENTRIES else ()) for e in entries}
        SCENARIOS[fn.__name__] = Scenario(fn.__name__, fn, table)
        return fn
    return register


def _for(entry: str, s: Setup) -> Setup:
    """xqa is decode: one query per request unless the scenario is speculative decoding."""
    if entry == "xqa" and not s.mask.startswith("spec"):
        return replace(s, q_lens=[1] * len(s.q_lens))
    return s


def _run(entry, dtype, seed, **setup) -> Case:
    return build(entry, _for(entry, Setup(**setup)), dtype, seed)


@scenario(ENTRIES, HALF, fp32=True)
def small_decode(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[1, 1, 1], kv_lens=[17, 33, 5], want_lse=True)


@scenario(PREFILL, HALF, fp32=True)
def gqa_causal_q_lt_kv(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[7, 3, 12], kv_lens=[20, 9, 40], hq=8, hkv=2, want_lse=True)


@scenario(("cudnn", "paged", "ragged", "single", "single_lse"), HALF, fp32=True)
def causal_q_gt_kv(entry, dtype, seed):  # rows before the first key are fully masked: out 0, lse -inf
    return _run(entry, dtype, seed, q_lens=[6, 3, 2], kv_lens=[2, 3, 9], want_lse=True)


@scenario(PREFILL)
def noncausal(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 4], kv_lens=[11, 9], causal=False, want_lse=True)


@scenario(("paged", "ragged", "single"))
def noncausal_q_gt_kv(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[9, 3], kv_lens=[4, 7], causal=False, want_lse=True)


@scenario(("trtllm", "xqa", "paged", "ragged", "single", "single_lse"), HALF, fp32=True)
def window(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[6, 1, 4], kv_lens=[30, 17, 9], window_left=5, want_lse=True)


@scenario(("paged", "ragged", "single", "single_lse"))
def window_noncausal(entry, dtype, seed):  # only the lower bound of the window applies
    return _run(entry, dtype, seed, q_lens=[5, 3], kv_lens=[12, 9], causal=False, window_left=4, want_lse=True)


@scenario(("paged", "ragged", "single", "single_lse"), HALF, fp32=True)
def soft_cap(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 8], kv_lens=[16, 8], soft_cap=1.5, sm_scale=0.4, want_lse=True)


@scenario(("trtllm", "xqa", "paged"), HALF)
def sinks(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[20, 7], sinks=True, want_lse=entry != "xqa")


@scenario(("paged", "ragged", "single", "single_lse"), fp32=True)
def custom_mask(entry, dtype, seed):  # includes a row with no kept key
    return _run(entry, dtype, seed, q_lens=[4, 3], kv_lens=[9, 5], causal=False, mask="custom", want_lse=True)


@scenario(("paged", "ragged", "single"))
def packed_custom_mask(entry, dtype, seed):  # q_len*kv_len % 8 == 0: per-request and global packing agree
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[6, 8], causal=False, mask="custom_packed",
                want_lse=True)


@scenario(("paged", "trtllm", "xqa", "cudnn", "single"))
def nhd(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[3, 5], kv_lens=[20, 11], layout="NHD", provide_out=False)


@scenario(("paged", "trtllm", "xqa", "cudnn", "single"))
def hnd(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[3, 5], kv_lens=[20, 11], layout="HND")


@scenario(("paged", "trtllm", "xqa", "cudnn"))
def five_d_cache(entry, dtype, seed):
    layout = "HND" if entry == "cudnn" else None
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[19, 26], cache_form="5d", layout=layout)


@scenario(("paged", "trtllm", "xqa"))
def tuple_cache(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[19, 26], cache_form="tuple")


@scenario(("paged", "trtllm", "cudnn"))
def odd_page_size(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[3, 6], kv_lens=[13, 21], page_size=5, permute_pages=True)


@scenario(("paged", "trtllm", "cudnn"))
def page_size_1(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[2, 3], kv_lens=[5, 7], page_size=1, permute_pages=True)


@scenario(("paged",))
def page_size_1_squeezed(entry, dtype, seed):  # 4-D (pages, 2, Hkv, D): P dim squeezed
    return _run(entry, dtype, seed, q_lens=[2, 3], kv_lens=[5, 7], page_size=1, cache_form="squeezed")


@scenario(("paged",))
def page_size_1_squeezed_tuple(entry, dtype, seed):  # tuple of 3-D (pages, Hkv, D)
    return _run(entry, dtype, seed, q_lens=[2, 3], kv_lens=[5, 7], page_size=1, cache_form="squeezed_tuple")


@scenario(("paged", "trtllm", "xqa", "cudnn"), HALF)
def random_page_permutation(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 2, 6], kv_lens=[40, 18, 33], permute_pages=True)


@scenario(ENTRIES)
def strided_inputs(entry, dtype, seed):  # packed-QKV column slices, x[..., :D] views, strided page views
    return _run(entry, dtype, seed, q_lens=[8, 5], kv_lens=[8, 5], strided=True, permute_pages=True)


@scenario(("cudnn", "trtllm", "paged", "ragged", "single", "single_lse"), HALF)
def lse(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 3], kv_lens=[12, 3], want_lse=True)


@scenario(("trtllm",))
def lse_buffer_only(entry, dtype, seed):  # a provided lse is filled even with return_lse=False
    return _run(entry, dtype, seed, q_lens=[5, 3], kv_lens=[12, 7], want_lse=True, variant="lse_buffer_only")


@scenario(("cudnn", "ragged"))
def head_dim_192_128(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[6, 3], kv_lens=[10, 17], dqk=192, dvo=128, want_lse=True)


@scenario(("trtllm", "xqa", "paged"), HALF)
def fp8_kv(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 3], kv_lens=[20, 9], fp8_kv=True)


@scenario(("xqa",), HALF)
def spec_decode(entry, dtype, seed):  # q_len_per_req 3, lower-triangular draft mask
    return _run(entry, dtype, seed, q_lens=[3, 3, 3], kv_lens=[10, 20, 5], mask="spec_causal")


@scenario(("xqa",))
def spec_decode_random_mask_window(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 4], kv_lens=[30, 12], mask="spec_random", window_left=6)


@scenario(("xqa",), HALF)
def spec_decode_ragged(entry, dtype, seed):  # q_cu_seq_lens with a zero-length draft
    return _run(entry, dtype, seed, q_lens=[3, 0, 2, 1], kv_lens=[12, 7, 9, 4], mask="spec_random",
                variant="q_cu")


@scenario(("trtllm", "xqa", "paged", "ragged", "single", "cudnn"))
def scales(entry, dtype, seed):  # bmm1 0-dim tensor, bmm2 0.7 (xqa o_scale 2); wrappers k/v_scale
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[10, 7], scale_mode="scales", sm_scale=0.2)


@scenario(("trtllm", "xqa"))
def scale_tensors(entry, dtype, seed):  # both bmm scales 0-dim fp32 tensors
    return _run(entry, dtype, seed, q_lens=[4, 2], kv_lens=[10, 7], scale_mode="tensors")


@scenario(("cudnn",))
def cudnn_token_offsets(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 2, 4], kv_lens=[9, 6, 30], variant="token_offsets", want_lse=True)


@scenario(("cudnn",))
def cudnn_ragged_token_offsets(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 2], kv_lens=[9, 6], variant="token_offsets", dvo=128, dqk=128)


@scenario(("cudnn",))
def cudnn_lens_1d(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 2], kv_lens=[9, 16], variant="lens_1d")


@scenario(("cudnn",))
def cudnn_ragged(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[5, 7], kv_lens=[9, 7], variant="ragged", want_lse=True)


@scenario(("trtllm",))
def cum_seq_lens_kv_ignored(entry, dtype, seed):  # a tensor of the wrong length: must not be read
    return _run(entry, dtype, seed, q_lens=[3, 4], kv_lens=[9, 20], variant="cum_kv_garbage")


@scenario(("paged", "ragged", "single"))
def rope_llama(entry, dtype, seed):
    return _run(entry, dtype, seed, q_lens=[4, 3], kv_lens=[11, 6], pos_encoding="ROPE_LLAMA", want_lse=True)
