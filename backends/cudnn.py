"""cuDNN SDPA through the nvidia-cudnn-frontend graph API (Python module ``cudnn``).

What the adapter hands to cuDNN (one fused SDPA node per graph):

* Q / O: the packed ``(total_q, H, D)`` tensors declared as ``(B, H, S_q, D)``
  with the caller's token/head strides and a *ragged offset* tensor
  ``(B+1, 1, 1, 1)`` int32 in ELEMENT units (``qo_indptr * token_stride``),
  so cuDNN reads and writes the packed rows in place.
* paged K / V: the page pool as ``(pages, Hkv, P, D)`` (a permuted view of our
  logical NHD pool: whatever the physical layout, its strides are passed as they
  are), page tables ``(B, 1, max_pages, 1)``, ``paged_attention_max_seq_len_kv``.
* ragged / dense K / V: ``(B, Hkv, S_kv, D)`` with ragged offsets
  ``kv_indptr * token_stride``.
* ``seq_len_q`` / ``seq_len_kv`` ``(B, 1, 1, 1)`` int32 with the padding mask;
  causal = bottom-right (``use_causal_mask_bottom_right``); a window adds
  ``diagonal_band_left_bound = window_left + 1`` with bottom-right alignment and
  right bound 0 (cuDNN excludes keys ``<= pos - left_bound``); sinks = the
  ``sink_token`` input ``(1, Hq, 1, 1)`` fp32 (cuDNN >= 9.13, not for one-token queries).
* Stats (LSE) with ``generate_stats``: natural log, declared ``(B, Hq, S_q, 1)``
  with a ragged offset ``qo_indptr * lse_token_stride`` so cuDNN writes straight
  into our packed ``(total_q, Hq)`` buffer; ``run`` then multiplies it by log2(e).
* ``out_scale`` != 1 is applied to ``out`` after the graph (cuDNN has no output scale).

Graph cache key (``GraphKey``): everything a built graph bakes in - the GPU (with its
index: a graph, its handle and workspace belong to one device), dtypes, KV
storage, batch size, *bucketed* max lengths (next power of two, at least 16;
one-token queries stay 1 unless sinks or LSE are asked for: then 2), head counts and dims, the strides of every operand,
the page-pool dims and page-table width, causal / window / sinks / LSE, and the
softmax scale when it is a float (a float scale is a graph constant; a 0-dim
device tensor scale is a runtime input and the key only records ``scale=None``).
Per-call values (lengths, offsets, page tables, pointers) are graph inputs and
never cause a rebuild. A serving loop with a fixed page pool therefore builds one
graph per (bucket, phase); the first build of each key is logged.

Caches (name: key -> bound):
* ``_graphs``: GraphKey -> (graph, workspace); keyed on batch sizes, length buckets and
  float scales, so an LRU of ``MAX_GRAPHS`` (an evicted entry lives on in the plans holding it);
* ``_handles``: device with its index -> cuDNN handle, created under that device (one per GPU);
* ``available`` / ``backend_version``: lru_cache on the singleton (one entry each).
Building and launching run under the tensors' GPU. A float sm_scale < 0 is refused
before any launch (_vendor.refuse_negative_scale; cuDNN's fused softmax is unverified for it).

Workspace: allocated once per key at plan time; ``run`` only binds pointers and
launches, so ``run`` can be captured in a CUDA graph after a warm-up plan.

Per call: cuDNN reads only each buffer's address (the declaration says what the bytes mean), so
metadata buffers are bound flat and as given (no reshape, no copy when int32 and contiguous),
offsets of one token stride share one multiply, and each graph keeps the cheapest execute its
frontend offers (``executor``: 1.32's ordered buffers, 1.22's sorted pointers, else the uid map).
``launcher`` binds the pack once for exact repeats (the lanes of the entry points): per call only
the operands, a function entry's index buffers (read from each batch) and the sinks are swapped
in; the stream is set on the handle only when it changed.
Build failures (``cudnnGraphNotSupportedError`` and friends) raise
``BackendRejected`` from ``plan``; errors during ``run`` propagate.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import operator
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch

from backends import _cudnn_internal as cudnn_internal, _numerics, _vendor
from backends._device import BoundedCache, device_key, kept_views, made_to_keep, on_device, on_device_launch
from backends.base import Backend, BackendRejected, Reason, import_reason

log = logging.getLogger("attn_dispatch")

MAX_GRAPHS = 128
CUDNN_ENTRY = "cudnn_batch_prefill_with_kv_cache"  # graphs of exact sizes, as FlashInfer's (graph_key)
MIN_BUCKET = 16
INT32_MAX = 2**31 - 1
SRC_CFE = "cudnn-frontend v1.23 include/cudnn_frontend/node/sdpa_support_surface.h"

# uids of the graph's operands (stable: the variant pack is keyed on them)
UID_Q, UID_K, UID_V, UID_O, UID_STATS = 1, 2, 3, 4, 5
UID_SEQ_Q, UID_SEQ_KV, UID_TABLE_K, UID_TABLE_V = 10, 11, 12, 13
UID_OFF_Q, UID_OFF_O, UID_OFF_K, UID_OFF_V, UID_OFF_STATS = 20, 21, 22, 23, 24
UID_SINK, UID_SCALE = 30, 31


def cudnn_module():
    """The vendor module, imported lazily (tests inject a fake through sys.modules)."""
    return importlib.import_module("cudnn")


def bucket(n: int) -> int:
    """Graph length for a batch maximum: 1 stays 1, else the next power of two >= 16."""
    if n <= 1:
        return 1
    return max(MIN_BUCKET, 1 << (int(n) - 1).bit_length())


# cuDNN backend-version gates: (min version, applies(problem, device), field, source)
VERSION_GATES = (
    (90500, lambda p, d: p.kv_storage == "paged", "kv_storage=paged", SRC_CFE + ": paged KV needs cuDNN >= 9.5"),
    (90700, lambda p, d: p.kv_storage == "paged", "kv_storage=paged with ragged Q",
     SRC_CFE + ": paged + ragged offsets need cuDNN >= 9.7"),
    (91300, lambda p, d: p.has_sinks, "has_sinks", SRC_CFE + ": SINK_TOKEN needs cuDNN >= 9.13"),
    (91801, lambda p, d: d.sm < 90, "ragged Q on sm < 90", SRC_CFE + ": ragged below SM90 needs cuDNN >= 9.18.1"),
    (91900, lambda p, d: p.window_left >= 0 and not p.causal, "has_window without causal",
     "FE 1.23 rejects a left bound without causal masking; measured: works on H100, cuDNN 9.19 / FE 1.32 (attn-dispatch probe, 2026-11-21)"),
    (91002, lambda p, d: p.kv_storage == "paged" and max(p.head_dim_qk, p.head_dim_vo) > 128,
     "paged head_dim > 128", SRC_CFE + ": paged with d > 128 needs cuDNN > 9.9"),
)
BROKEN_VERSIONS = {91000: "9.10.0", 91001: "9.10.1"}  # fp16/bf16 SDPA forward rejected by the FE


@dataclass(frozen=True)
class GraphKey:
    """What a built cuDNN graph bakes in (see the module docstring)."""

    device: torch.device  # with its index
    io_dtype: str
    kv_storage: str  # "paged" | "ragged" (dense is ragged with full lengths)
    batch_size: int
    s_q: int
    s_kv: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    q_strides: tuple  # (token, head) of the packed Q
    o_strides: tuple
    k_layout: tuple  # paged: (dims, strides) of the (pages, Hkv, P, D) pool; ragged: (token, head) strides
    v_layout: tuple
    table_width: int  # page-table columns (0 unless paged)
    causal: bool
    window_left: int
    has_sinks: bool
    lse_strides: Optional[tuple]  # None: no LSE; packed: (token, head); padded: the 4 strides as declared
    scale: Optional[float]  # None: a device tensor bound at run time
    lse_padded: bool = False  # Stats in FlashInfer's form: (B, Hq, S_q, 1) at fixed strides, no ragged offset
    exact: bool = False  # the cuDNN entry: exact S_q / S_kv and Q's batch stride one token, as FlashInfer's graph


@dataclass
class GraphEntry:
    graph: Any
    workspace: torch.Tensor
    build_seconds: float
    order: tuple = ()  # the uids of the buffers ``execute`` takes, in the order it takes them
    execute: Any = None  # execute(buffers, handle): the cheapest call this frontend offers (_executor)
    pool_views: bool = True  # whether the executor reads geometry: paged K/V go as the declared (pages, Hkv, P, D) views


@dataclass
class CudnnPlan:
    """The cached graph for a problem, plus the planning batch's metadata buffers. A run with
    another batch reuses the graph when the batch's facts (``batch_facts``) match the planning
    batch's, and its buffers when the batch says its index tensors are static and they are the
    same objects; otherwise the buffers are derived again (a few device ops, no host sync)."""

    key: GraphKey
    entry: GraphEntry
    inputs: dict  # uid -> tensor (metadata buffers and fixed views) of the planning batch
    problem: Any = None  # what the graph was planned for (run() re-checks the batch against key)
    planned_on: Any = None  # weakref to the batch it was planned with: that one needs no re-check
    facts: tuple = ()  # batch_facts of the planning batch: equal facts, equal graph key
    sources: tuple = ()  # the planning batch's index tensors (index_sources), for static reuse


# --------------------------------------------------------------------------- key
def _pool_view(pool: torch.Tensor) -> torch.Tensor:
    """(pages, P, Hkv, D) logical NHD pool -> the (pages, Hkv, P, D) view cuDNN reads (kept per
    pool object: the entry points hand over the same kept logical views on every call)."""
    return kept_views(pool, "cudnn-pool", _permuted_pool)[0]


def _permuted_pool(pool: torch.Tensor) -> tuple:
    return (pool.permute(0, 2, 1, 3),)


def _is_tensor_scale(scale) -> bool:
    return isinstance(scale, torch.Tensor)


def batch_facts(batch) -> tuple:
    """Everything of a batch that ``graph_key`` reads besides the problem: equal facts, equal
    key (cheaper to build and compare than the key itself, on every run of a kept plan)."""
    table, lse, scale = batch.block_table, batch.lse, batch.sm_scale
    return (batch.q.device, batch.q.shape, batch.q.stride(), batch.out.stride(), batch.k.shape, batch.k.stride(),
            batch.v.shape, batch.v.stride(), None if table is None else table.shape,
            None if lse is None else lse.stride(), batch.batch_size, batch.max_q_len, batch.max_kv_len,
            None if _is_tensor_scale(scale) else float(scale), _padded_facts(batch))


def _padded_facts(batch) -> Optional[tuple]:
    padded = _padded_lse(batch)
    return None if padded is None else (padded.shape, padded.stride())


def _padded_lse(batch) -> Optional[torch.Tensor]:
    """The caller's padded (B, max_q, Hq) fp32 LSE buffer the cuDNN entry hands over
    (``extras["cudnn"]["lse_padded"]``), when the call wants the LSE."""
    if batch.lse is None:
        return None
    return batch.extras.get("cudnn", _NONE_GIVEN).get("lse_padded")


def index_sources(batch) -> tuple:
    """The batch tensors the metadata buffers are derived from."""
    return (batch.qo_indptr, batch.kv_lens, batch.block_table, batch.kv_indptr, batch.sinks, batch.v_block_table)


def graph_key(problem, batch) -> GraphKey:
    """The cache key of the graph serving this batch (host-only: shapes and strides)."""
    paged = problem.kv_storage == "paged"
    # The cuDNN entry's graph is FlashInfer's for the same call: its S_q and S_kv are the call's
    # max_token_per_sequence and max_sequence_kv (flashinfer 0.5.3 flashinfer/cudnn/prefill.py keys
    # its graph cache on both); other entries bucket them (one graph per bucket in a serving loop).
    size = (lambda n: max(int(n), 1)) if problem.entry == CUDNN_ENTRY else bucket
    if paged:
        kv = tuple((tuple(_pool_view(t).shape), tuple(_pool_view(t).stride())) for t in (batch.k, batch.v))
        # cuDNN reads a page table exactly ceil(S_kv / page_size) wide (9.19 with frontend 1.32 declines
        # any other width: "block table size must equal ceil(s_kv/block_size)"), so the table is cut or
        # padded to S_kv's pages (table_of; a column past a request's pages is never read), and a graph
        # per table width is never built. S_kv: the cuDNN entry's max_sequence_kv (FlashInfer's graph);
        # elsewhere the bucket of the longest request, within the bucket of the table's reach (an
        # engine's table is as wide as its longest context: S_kv follows the batch, not the table)
        width = int(batch.block_table.shape[1])
        s_kv = size(batch.max_kv_len)
        if problem.entry != CUDNN_ENTRY:
            s_kv = min(s_kv, bucket(width) * problem.page_size)
        width = -(-s_kv // problem.page_size)
    else:
        kv = tuple(tuple(t.stride()[:2]) for t in (batch.k, batch.v))
        s_kv, width = size(batch.max_kv_len), 0
    s_q = size(batch.max_q_len)
    lse_strides, lse_padded = _lse_form(problem, batch)
    padded = _padded_lse(batch)
    if padded is not None:  # the entry's padded buffer: FlashInfer's exact S_q (max_token_per_sequence)
        s_q = padded.shape[1]
    elif s_q == 1 and (problem.has_sinks or (lse_strides is not None and not lse_padded)):
        s_q = 2  # one-row graphs: cuDNN refuses sink_token; packed ragged Stats were not written (H100 probe)
    scale = None if _is_tensor_scale(batch.sm_scale) else float(batch.sm_scale)
    return GraphKey(
        device=device_key(batch.q.device), io_dtype=problem.q_dtype, kv_storage="paged" if paged else "ragged", batch_size=batch.batch_size,
        s_q=s_q, s_kv=s_kv, num_qo_heads=problem.num_qo_heads, num_kv_heads=problem.num_kv_heads,
        head_dim_qk=problem.head_dim_qk, head_dim_vo=problem.head_dim_vo,
        q_strides=tuple(batch.q.stride()[:2]), o_strides=tuple(batch.out.stride()[:2]),
        k_layout=kv[0], v_layout=kv[1], table_width=width, causal=problem.causal,
        window_left=problem.window_left, has_sinks=problem.has_sinks,
        lse_strides=lse_strides, scale=scale, lse_padded=lse_padded, exact=problem.entry == CUDNN_ENTRY)


# FlashInfer 0.5.3 (flashinfer/cudnn/prefill.py) declares Stats (B, Hq, S_q, 1) with strides
# (S_q * Hq, 1, Hq, 1) and no ragged offset: the padded (B, max_q, Hq) LSE written in place. We
# declare a one-row call's LSE that way too (False: the packed form on a two-row graph, as before).
ONE_ROW_STATS_AS_FLASHINFER = True


def _lse_form(problem, batch) -> tuple:
    """(lse_strides, lse_padded) of the graph: None without LSE; the entry's padded buffer in
    FlashInfer's form; a one-row call's packed (B, Hq) LSE, which is that form with S_q = 1
    (one query row per request: request b's row is row b); else the packed ragged form."""
    lse = batch.lse
    if lse is None:
        return None, False
    padded = _padded_lse(batch)
    if padded is not None:
        return (padded.stride(0), padded.stride(2), padded.stride(1), 1), True
    if (ONE_ROW_STATS_AS_FLASHINFER and batch.max_q_len == 1 and batch.q.shape[0] == batch.batch_size
            and not problem.has_sinks):
        return (lse.stride(0), lse.stride(1), lse.stride(0), 1), True
    return tuple(lse.stride()), False


def _serves(plan, batch) -> bool:
    """Whether the plan's graph is the graph of ``batch``'s key (equal facts, equal key)."""
    return (plan.planned_on is not None and plan.planned_on() is batch) or batch_facts(batch) == plan.facts \
        or graph_key(plan.problem, batch) == plan.key


# ------------------------------------------------------------------------- graph
def _dtype(cudnn, name: str):
    return {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16,
            "float32": cudnn.data_type.FLOAT, "int32": cudnn.data_type.INT32}[name]


def _offsets(g, cudnn, key: GraphKey, uid: int):
    return g.tensor(name=f"offsets_{uid}", dim=(key.batch_size + 1, 1, 1, 1), stride=(1, 1, 1, 1),
                    data_type=_dtype(cudnn, "int32"), uid=uid)


def _packed(g, cudnn, key, name, uid, heads, dim, strides, s, off_uid, batch_stride=None):
    """A packed (total, H, D) operand declared as (B, H, S, D) with ragged offsets (which locate each
    request: ``batch_stride``, default S tokens, is what the declaration says besides)."""
    token, head = strides
    batch_stride = s * token if batch_stride is None else batch_stride
    t = g.tensor(name=name, dim=(key.batch_size, heads, s, dim), stride=(batch_stride, head, token, 1),
                 data_type=_dtype(cudnn, key.io_dtype), uid=uid)
    t.set_ragged_offset(_offsets(g, cudnn, key, off_uid))
    return t


def _kv_operands(g, cudnn, key: GraphKey):
    """K and V operands plus the paged-attention keyword arguments."""
    if key.kv_storage == "paged":
        k = g.tensor(name="k", dim=key.k_layout[0], stride=key.k_layout[1], data_type=_dtype(cudnn, key.io_dtype), uid=UID_K)
        v = g.tensor(name="v", dim=key.v_layout[0], stride=key.v_layout[1], data_type=_dtype(cudnn, key.io_dtype), uid=UID_V)
        table_dim = (key.batch_size, 1, key.table_width, 1)
        tk, tv = (g.tensor(name=n, dim=table_dim, stride=(key.table_width, key.table_width, 1, 1),
                           data_type=_dtype(cudnn, "int32"), uid=u)
                  for n, u in (("table_k", UID_TABLE_K), ("table_v", UID_TABLE_V)))
        return k, v, dict(paged_attention_k_table=tk, paged_attention_v_table=tv,
                          paged_attention_max_seq_len_kv=key.s_kv)
    k = _packed(g, cudnn, key, "k", UID_K, key.num_kv_heads, key.head_dim_qk, key.k_layout, key.s_kv, UID_OFF_K)
    v = _packed(g, cudnn, key, "v", UID_V, key.num_kv_heads, key.head_dim_vo, key.v_layout, key.s_kv, UID_OFF_V)
    return k, v, {}


def _mask_kwargs(cudnn, key: GraphKey) -> dict:
    """Causal bottom-right, and the inclusive window as a left band bound of W + 1."""
    if key.window_left >= 0:
        return dict(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                    diagonal_band_right_bound=0 if key.causal else None,
                    diagonal_band_left_bound=_numerics.cudnn_left_bound(key.window_left))
    return dict(use_causal_mask_bottom_right=key.causal)


def _sdpa_kwargs(g, cudnn, key: GraphKey) -> dict:
    length_dim = dict(dim=(key.batch_size, 1, 1, 1), stride=(1, 1, 1, 1), data_type=_dtype(cudnn, "int32"))
    kwargs = dict(seq_len_q=g.tensor(name="seq_len_q", uid=UID_SEQ_Q, **length_dim),
                  seq_len_kv=g.tensor(name="seq_len_kv", uid=UID_SEQ_KV, **length_dim),
                  use_padding_mask=True, generate_stats=key.lse_strides is not None,
                  compute_data_type=_dtype(cudnn, "float32"), **_mask_kwargs(cudnn, key))
    if key.scale is None:
        kwargs["attn_scale"] = g.tensor(name="attn_scale", dim=(1, 1, 1, 1), stride=(1, 1, 1, 1),
                                        data_type=_dtype(cudnn, "float32"), uid=UID_SCALE)
    else:
        kwargs["attn_scale"] = key.scale
    if key.has_sinks:
        h = key.num_qo_heads
        kwargs["sink_token"] = g.tensor(name="sink_token", dim=(1, h, 1, 1), stride=(h, 1, 1, 1),
                                        data_type=_dtype(cudnn, "float32"), uid=UID_SINK)
    return kwargs


def _declare_outputs(g, cudnn, key: GraphKey, o, stats) -> None:
    token, head = key.o_strides
    o.set_output(True).set_dim([key.batch_size, key.num_qo_heads, key.s_q, key.head_dim_vo]) \
        .set_stride([key.s_q * token, head, token, 1]).set_data_type(_dtype(cudnn, key.io_dtype)).set_uid(UID_O)
    o.set_ragged_offset(_offsets(g, cudnn, key, UID_OFF_O))
    if key.lse_padded:
        stats.set_output(True).set_dim([key.batch_size, key.num_qo_heads, key.s_q, 1]) \
            .set_stride(list(key.lse_strides)).set_data_type(_dtype(cudnn, "float32")).set_uid(UID_STATS)
    elif key.lse_strides is not None:
        token, head = key.lse_strides
        stats.set_output(True).set_dim([key.batch_size, key.num_qo_heads, key.s_q, 1]) \
            .set_stride([key.s_q * token, head, token, 1]).set_data_type(_dtype(cudnn, "float32")).set_uid(UID_STATS)
        stats.set_ragged_offset(_offsets(g, cudnn, key, UID_OFF_STATS))


def build_graph(cudnn, key: GraphKey, handle, modes: Optional[list] = None) -> Any:
    """Declare, validate and build one SDPA graph (raises the vendor's errors). ``modes``: the
    heuristics asked for plans, by default heuristic A alone, as FlashInfer 0.5.3 builds its graph
    (``cudnn.jit(heur_modes=[cudnn.heur_mode.A])``); ``CudnnBackend._build`` adds FALLBACK only when
    A proposes no plan that builds."""
    g = cudnn.pygraph(io_data_type=_dtype(cudnn, key.io_dtype), intermediate_data_type=_dtype(cudnn, "float32"),
                      compute_data_type=_dtype(cudnn, "float32"), handle=handle)
    # flashinfer 0.5.3 declares Q's batch stride as one token row (its ragged offsets locate requests)
    q = _packed(g, cudnn, key, "q", UID_Q, key.num_qo_heads, key.head_dim_qk, key.q_strides, key.s_q, UID_OFF_Q,
                key.q_strides[0] if key.exact else None)
    k, v, paged = _kv_operands(g, cudnn, key)
    o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, **paged, **_sdpa_kwargs(g, cudnn, key))
    _declare_outputs(g, cudnn, key, o, stats)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans(modes or [cudnn.heur_mode.A])
    g.check_support()
    g.build_plans()
    return g


# ---------------------------------------------------------------- per-call inputs
# cuDNN reads only the pointer of each buffer: the graph's declaration says what the bytes mean
# (cudnn-frontend 1.32 cudnn/_pygraph.py, Graph._normalize: "The backend reads only the pointer";
# a dense buffer covering the declared bytes is re-described as the declaration). So metadata
# buffers go flat, as they are when already int32 and contiguous: no reshape, no copy, no launch.
def table_of(key: GraphKey, table: torch.Tensor) -> torch.Tensor:
    """The block table as the graph reads it: int32, ``key.table_width`` columns (a narrower one
    padded with page 0, a wider one cut: the columns past a request's pages are never read)."""
    table = _int32(table)
    if table.shape[1] == key.table_width:
        return table
    if table.shape[1] > key.table_width:
        return table[:, : key.table_width].contiguous()
    padded = table.new_zeros(table.shape[0], key.table_width)
    padded[:, : table.shape[1]] = table
    return padded


def _tables(key: GraphKey, batch) -> dict:
    """uid -> page table: K's, and V's own where its pages have ids of their own (cuDNN's SDPA takes
    a table per operand), else K's for both."""
    k = table_of(key, batch.block_table)
    return {UID_TABLE_K: k, UID_TABLE_V: k if batch.v_block_table is None else table_of(key, batch.v_block_table)}


def _int32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous int32 (itself when it is: no op dispatched)."""
    if t.dtype is torch.int32 and t.is_contiguous():
        return t
    return t.to(torch.int32).contiguous()


def _element_offsets(indptr: torch.Tensor, token_stride: int) -> torch.Tensor:
    """Token prefix sums -> ragged offsets in ELEMENTS, (B+1,) int32 (one device op, no sync)."""
    return _int32(indptr) * int(token_stride)


def _check_int32_extent(name: str, tensor: torch.Tensor) -> Optional[Reason]:
    extent = tensor.shape[0] * tensor.stride(0)
    if extent > INT32_MAX:
        return Reason(f"{name} elements", extent, f"<= {INT32_MAX} (int32 ragged offsets)", "backends/cudnn.py")
    return None


def pack_uids(key: GraphKey) -> tuple:
    """Every uid the graph of ``key`` reads a buffer for (its variant pack)."""
    uids = [UID_Q, UID_K, UID_V, UID_O, UID_SEQ_Q, UID_SEQ_KV, UID_OFF_Q, UID_OFF_O]
    uids += [UID_TABLE_K, UID_TABLE_V] if key.kv_storage == "paged" else [UID_OFF_K, UID_OFF_V]
    if key.lse_strides is not None:
        uids += [UID_STATS] if key.lse_padded else [UID_STATS, UID_OFF_STATS]
    if key.has_sinks:
        uids.append(UID_SINK)
    if key.scale is None:
        uids.append(UID_SCALE)
    return tuple(uids)


def _strided_offsets(indptr: torch.Tensor, strides: dict) -> dict:
    """uid -> ``indptr * stride`` element offsets; uids of one stride share one tensor (one launch)."""
    made: dict = {}
    offsets = {}
    for uid, stride in strides.items():
        if stride not in made:
            made[stride] = _element_offsets(indptr, stride)
        offsets[uid] = made[stride]
    return offsets


def call_inputs(key: GraphKey, batch) -> dict:
    """uid -> tensor for everything but Q/K/V/O/LSE pointers. ``batch.extras["cudnn"]`` may hold
    the caller's own buffers in cuDNN's convention (``seq_q``: B int32 query lengths; ``off_q``
    / ``off_o``: B+1 int32 element offsets for Q's / O's token stride; any shape): they are used
    as they are (made contiguous if they are not), instead of being derived from the token indptr."""
    given = batch.extras.get("cudnn", _NONE_GIVEN)
    seq_q = given.get("seq_q")
    inputs = {UID_SEQ_Q: _int32(seq_q if seq_q is not None else batch.qo_indptr[1:] - batch.qo_indptr[:-1]),
              UID_SEQ_KV: _int32(batch.kv_lens)}
    derived = {uid: st for uid, name, st in ((UID_OFF_Q, "off_q", key.q_strides[0]), (UID_OFF_O, "off_o", key.o_strides[0]))
               if given.get(name) is None}
    inputs.update((uid, _int32(given[name])) for uid, name in ((UID_OFF_Q, "off_q"), (UID_OFF_O, "off_o"))
                  if uid not in derived)
    if key.lse_strides is not None and not key.lse_padded:
        derived[UID_OFF_STATS] = key.lse_strides[0]
    if derived:  # read only when needed: the cuDNN entry's indptr is divided out of the offsets on read
        inputs.update(_strided_offsets(batch.qo_indptr, derived))
    if key.kv_storage == "paged":
        inputs.update(_tables(key, batch))
    else:
        inputs.update(_strided_offsets(batch.kv_indptr, {UID_OFF_K: key.k_layout[0], UID_OFF_V: key.v_layout[0]}))
    if key.has_sinks:
        inputs[UID_SINK] = _float32(batch.sinks)
    return inputs


_NONE_GIVEN: dict = {}


def _float32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype is torch.float32 and t.is_contiguous():
        return t
    return t.to(torch.float32).contiguous()


def _stats_of(key: GraphKey, batch) -> torch.Tensor:
    """The buffer cuDNN writes the Stats into: the entry's padded LSE when it gave one, else ours."""
    padded = _padded_lse(batch) if key.lse_padded else None
    return padded if padded is not None else batch.lse


def _scale_tensor(key: GraphKey, batch) -> Optional[torch.Tensor]:
    if key.scale is not None:
        return None
    return _float32(batch.sm_scale)


# ---------------------------------------------------------------- exact repeats
def _operand_uids(key: GraphKey) -> tuple:
    return (UID_Q, UID_K, UID_V, UID_O) + ((UID_STATS,) if key.lse_strides is not None else ())


def _operand_getter(key: GraphKey, pool_views: bool, given: dict):
    """batch -> its operands in ``_operand_uids`` order (one attrgetter call). ``given``: the first
    batch's caller buffers (a repeat's have the same keys): the entry's own pool tensors, already
    the (pages, Hkv, P, D) views cuDNN reads, save a view per pool per call."""
    get = operator.attrgetter(*("q", "k", "v", "out") + (("lse",) if key.lse_strides is not None else ()))
    if key.lse_strides is not None and "lse_padded" in given:  # the entry's padded buffer, not the packed
        plain = get

        def get(batch) -> tuple:
            *rest, _ = plain(batch)
            return (*rest, batch.extras["cudnn"]["lse_padded"])
    if key.kv_storage != "paged" or not pool_views:
        return get
    if "pool_k" in given:
        def with_caller_pools(batch) -> tuple:
            q, _, _, *rest = get(batch)
            pools = batch.extras["cudnn"]
            return (q, pools["pool_k"], pools["pool_v"], *rest)

        return with_caller_pools

    def with_pool_views(batch) -> tuple:
        q, k, v, *rest = get(batch)
        return (q, _pool_view(k), _pool_view(v), *rest)

    return with_pool_views


def _as_read(sample: torch.Tensor, dtype: torch.dtype, get):
    """batch -> ``get(batch)`` as cuDNN reads it. The lane proves every repeat's dtype and strides
    are ``sample``'s, so whether a conversion is needed is decided once, here."""
    if sample.dtype is dtype and sample.is_contiguous():
        return get
    return lambda batch: get(batch).to(dtype).contiguous()


def _offset_binders(indptr_of, strides: dict) -> list:
    """(uids, batch -> indptr * stride) per distinct stride (uids of one stride share one launch)."""
    by_stride: dict = {}
    for uid, stride in strides.items():
        by_stride.setdefault(int(stride), []).append(uid)
    return [(tuple(uids), lambda b, st=st: indptr_of(b) * st) for st, uids in by_stride.items()]


def _index_binders(plan: CudnnPlan, batch) -> list:
    """(uids, tensor or batch -> tensor) for every buffer but the operands: a wrapper's static
    index buffers bound as the plan derived them; a function entry's read from each batch.
    Sinks are read per call either way (they are an argument, not an index)."""
    key = plan.key
    binders: list = []
    if key.has_sinks:
        binders.append(((UID_SINK,), _as_read(batch.sinks, torch.float32, operator.attrgetter("sinks"))))
    if batch.extras.get("static_indices") and all(a is b for a, b in zip(index_sources(batch)[:4], plan.sources[:4])):
        return binders + [((uid,), t) for uid, t in plan.inputs.items() if uid != UID_SINK]
    given = batch.extras.get("cudnn", _NONE_GIVEN)
    qo = _as_read(batch.qo_indptr, torch.int32, operator.attrgetter("qo_indptr"))

    def caller_buffer(name: str):
        return _as_read(given[name], torch.int32, lambda b: b.extras["cudnn"][name])

    seq_q = caller_buffer("seq_q") if given.get("seq_q") is not None else (lambda b: qo(b)[1:] - qo(b)[:-1])
    binders += [((UID_SEQ_Q,), seq_q), ((UID_SEQ_KV,), _as_read(batch.kv_lens, torch.int32, operator.attrgetter("kv_lens")))]
    derived = {}
    for uid, name, stride in ((UID_OFF_Q, "off_q", key.q_strides[0]), (UID_OFF_O, "off_o", key.o_strides[0])):
        if given.get(name) is not None:
            binders.append(((uid,), caller_buffer(name)))
        else:
            derived[uid] = stride
    if key.lse_strides is not None and not key.lse_padded:
        derived[UID_OFF_STATS] = key.lse_strides[0]
    binders += _offset_binders(qo, derived)
    if key.kv_storage == "paged":
        if batch.v_block_table is None:
            binders.append(((UID_TABLE_K, UID_TABLE_V), lambda b: table_of(key, b.block_table)))
        else:  # V's pages by ids of their own (uses_shared_paged_kv_idx=False)
            binders += [((UID_TABLE_K,), lambda b: table_of(key, b.block_table)),
                        ((UID_TABLE_V,), lambda b: table_of(key, b.v_block_table))]
    else:
        kv = _as_read(batch.kv_indptr, torch.int32, operator.attrgetter("kv_indptr"))
        binders += _offset_binders(kv, {UID_OFF_K: key.k_layout[0], UID_OFF_V: key.v_layout[0]})
    return binders


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds


def _current_stream(device: torch.device) -> int:
    """The current stream's handle on ``device`` (the raw read: no Stream object is made)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _takes_uid_order(graph) -> bool:
    """cudnn-frontend >= 1.32: ``execute(buffers, workspace, handle, tensor_uids=...)`` (a list of
    buffers in the caller's uid order; no dict built or walked per call)."""
    try:
        return "tensor_uids" in inspect.signature(graph.execute).parameters
    except (TypeError, ValueError):  # a pybind method: no signature to read
        return False


def _frontend_version() -> str:
    """The installed cudnn-frontend's version ("" where it does not say): what its private paths are pinned to."""
    return str(getattr(cudnn_module(), "__version__", ""))


def _raw_after_first(graph, uids: tuple, workspace: torch.Tensor, ordered):
    """execute(buffers, handle): the first call through ``ordered`` (the frontend's own execute,
    which finishes any lazy build), later calls through ``cudnn_internal.raw_pointer_call`` where it
    applies (a pinned frontend version)."""
    raw = None

    def execute(buffers, handle) -> None:
        nonlocal raw
        if raw is not None:
            raw(buffers, handle)
            return
        ordered(buffers, handle)
        raw = cudnn_internal.raw_pointer_call(graph, uids, workspace, _frontend_version()) or ordered

    return execute


def executor(graph, key: GraphKey, workspace: torch.Tensor) -> tuple:
    """(order, execute(buffers, handle), pool_views): the cheapest execute this frontend has.

    * 1.32+: ``execute(buffers, workspace, handle, tensor_uids=order)`` (what its own SDPA op calls,
      cudnn-frontend 1.32 cudnn/sdpa/fwd/torch_op.py);
    * 1.22.0 - 1.23.0: ``_execute_with_ptrs`` (backends/_cudnn_internal.py) with pointers in the
      graph's sorted uid order (what its experimental SDPA op calls, cudnn-frontend 1.23
      python/cudnn/experimental/ops/sdpa.py); it reads pointers only, so paged K/V need no
      (pages, Hkv, P, D) view;
    * others: the uid -> tensor map of ``execute``.
    """
    uids = pack_uids(key)
    if _takes_uid_order(graph):
        def execute_ordered(buffers, handle) -> None:
            graph.execute(buffers, workspace, handle=handle, tensor_uids=uids)
        return uids, _raw_after_first(graph, uids, workspace, execute_ordered), True
    order = cudnn_internal.sorted_uids(graph, _frontend_version())
    if order is not None and sorted(order) == sorted(uids):
        return order, cudnn_internal.pointer_execute(graph, workspace), False

    def execute_map(buffers, handle) -> None:
        graph.execute(dict(zip(uids, buffers)), workspace, handle=handle)
    return uids, execute_map, True


# ----------------------------------------------------------------------- backend
class CudnnBackend(Backend):
    name = "cudnn"
    packages = ("cudnn",)

    def __init__(self) -> None:
        self._graphs = BoundedCache(MAX_GRAPHS)
        self._handles: dict[torch.device, Any] = {}
        self._streams: dict = {}  # handle -> the stream last set on it (_stream_handle)
        self._lock = threading.Lock()

    # -- availability -------------------------------------------------------
    @functools.lru_cache(maxsize=None)
    def available(self) -> Reason | None:
        try:
            cudnn = cudnn_module()
        except Exception as exc:  # noqa: BLE001 - any import failure is a reason
            return import_reason("cudnn", exc)
        if not torch.cuda.is_available():
            return Reason("device", "no CUDA device", "a CUDA GPU (SM80+)")
        try:
            backend = int(cudnn.backend_version())
        except Exception as exc:  # noqa: BLE001 - libcudnn missing or broken
            return Reason("cuDNN library", f"unusable: {type(exc).__name__}: {exc}", "cuDNN >= 9.5 loadable by cudnn-frontend")
        if backend in BROKEN_VERSIONS:
            return Reason("cuDNN library", BROKEN_VERSIONS[backend], "not 9.10.0/9.10.1 (SDPA forward broken)", SRC_CFE)
        return None

    @functools.lru_cache(maxsize=None)
    def backend_version(self) -> Optional[int]:
        try:
            return int(cudnn_module().backend_version())
        except Exception:  # noqa: BLE001 - not installed: version gates cannot apply
            return None

    def version(self) -> str | None:
        try:
            cudnn = cudnn_module()
            return f"cudnn-frontend {getattr(cudnn, '__version__', '?')}, cuDNN {cudnn.backend_version_string()}"
        except Exception:  # noqa: BLE001
            return None

    # -- capability ---------------------------------------------------------
    def extra_checks(self, problem, device) -> list[Reason]:
        reasons = []  # the dtype rules (K/V and out = Q's: no sdpa_fp8 path) are data: cudnn.json
        version = self.backend_version()
        if version is not None and device.kind == "cuda":
            for minimum, applies, field, source in VERSION_GATES:
                if applies(problem, device) and version < minimum:
                    reasons.append(Reason(field, f"cuDNN {version}", f"cuDNN >= {minimum}", source))
        return reasons

    # -- execution ----------------------------------------------------------
    def _handle(self, cudnn, device: torch.device):
        """The handle of this GPU (created under it: a handle belongs to the current device)."""
        device = device_key(device)
        handle = self._handles.get(device)
        if handle is None:
            with on_device(device):
                handle = self._handles[device] = cudnn.create_handle()
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device).cuda_stream
            cudnn.set_stream(handle, stream)
            self._streams[handle] = stream
        return handle

    def _plan_time_reasons(self, problem, batch) -> list[Reason]:
        tensors = [("q", batch.q), ("out", batch.out)] + ([] if problem.kv_storage == "paged" else [("k", batch.k), ("v", batch.v)])
        reasons = [r for r in (_check_int32_extent(n, t) for n, t in tensors) if r is not None]
        for name, t in tensors + [("k", batch.k), ("v", batch.v)]:
            if t.stride(-1) != 1:
                reasons.append(Reason(f"{name}.stride(-1)", t.stride(-1), "1 (contiguous head dim)", SRC_CFE))
        return reasons

    def _entry(self, cudnn, key: GraphKey, device: torch.device) -> GraphEntry:
        with self._lock:  # the LRU reorders on lookup: one thread at a time
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._graphs.put(key, self._build(cudnn, key, device))
        return entry

    def _build(self, cudnn, key: GraphKey, device: torch.device) -> GraphEntry:
        start = time.perf_counter()
        try:
            with on_device(device):
                try:
                    graph = build_graph(cudnn, key, self._handle(cudnn, device))
                except Exception:  # noqa: BLE001 - heuristic A proposed nothing that builds: add FALLBACK
                    graph = build_graph(cudnn, key, self._handle(cudnn, device),
                                        [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            size = int(graph.get_workspace_size())
        except Exception as exc:  # noqa: BLE001 - nothing launched yet: a plan-time refusal
            reason = Reason("cudnn graph", f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                            "a graph this cuDNN build supports", SRC_CFE)
            raise BackendRejected(self.name, [reason]) from exc
        workspace = made_to_keep(lambda: torch.empty(max(size, 1), dtype=torch.uint8, device=device), device)
        seconds = time.perf_counter() - start
        log.info("attn_dispatch: cudnn built a graph in %.3f s (workspace %d B) for %s", seconds, size, key)
        return GraphEntry(graph, workspace, seconds, *executor(graph, key, workspace))

    def plan(self, problem, batch) -> CudnnPlan:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "cudnn (attn_scale)")
        reasons = self._plan_time_reasons(problem, batch)
        if reasons:
            raise BackendRejected(self.name, reasons)
        cudnn = cudnn_module()
        key = graph_key(problem, batch)
        entry = self._entry(cudnn, key, batch.q.device)
        with on_device(batch.q.device):
            return CudnnPlan(key, entry, call_inputs(key, batch), problem, weakref.ref(batch), batch_facts(batch),
                             index_sources(batch))

    def plan_reusable(self, problem) -> bool:
        # The plan is the graph: run() checks each batch's facts against it and derives the
        # per-call buffers (lengths, offsets, tables) from the batch it is given.
        return True

    def run(self, plan: CudnnPlan, batch) -> None:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "cudnn (attn_scale)")  # before launch
        inputs = self._bound_inputs(plan, batch)
        if inputs is None:
            # The graph bakes strides, sizes and a float scale: a batch that differs (another
            # layer's cache view, another k_scale) gets the graph of its own key, never the old one.
            plan = self.plan(plan.problem, batch)
            inputs = plan.inputs
        with on_device(batch.q.device):
            self._launch(plan, inputs, batch)

    @staticmethod
    def _bound_inputs(plan: CudnnPlan, batch) -> Optional[dict]:
        """The metadata buffers for ``batch`` on this plan's graph, or None when the batch needs
        another graph. The planning batch itself, and a batch whose static index tensors are the
        planning batch's (the wrappers' plan-time tensors, never written), use the plan's."""
        if plan.planned_on is not None and plan.planned_on() is batch:  # the functions' plan-then-run
            return plan.inputs
        if plan.problem is None:
            return plan.inputs
        if not _serves(plan, batch):
            return None
        if batch.extras.get("static_indices") and all(a is b for a, b in zip(index_sources(batch), plan.sources)):
            return plan.inputs
        with on_device(batch.q.device):
            return call_inputs(plan.key, batch)

    def _launch(self, plan: CudnnPlan, inputs: dict, batch) -> None:
        cudnn = cudnn_module()
        entry = plan.entry
        pack = dict(inputs)
        k, v = batch.k, batch.v
        if plan.key.kv_storage == "paged" and entry.pool_views:
            k, v = _pool_view(k), _pool_view(v)
        pack.update({UID_Q: batch.q, UID_K: k, UID_V: v, UID_O: batch.out})
        stats = None
        if plan.key.lse_strides is not None:
            stats = pack[UID_STATS] = _stats_of(plan.key, batch)
            if plan.key.lse_padded and plan.key.s_q > 1:
                stats.fill_(float("-inf"))  # rows past a request's length: -inf (cuDNN writes valid rows)
        scale_tensor = _scale_tensor(plan.key, batch)  # per call: a device scale is a runtime input
        if scale_tensor is not None:
            pack[UID_SCALE] = scale_tensor
        entry.execute([pack[uid] for uid in entry.order], self._stream_handle(cudnn, batch.q.device))
        if stats is not None:
            stats.mul_(_numerics.LOG2E)  # cuDNN Stats are natural-log; our LSE is base 2
        if _is_tensor_scale(batch.out_scale) or float(batch.out_scale) != 1.0:
            batch.out.mul_(batch.out_scale)

    def _stream_handle(self, cudnn, device: torch.device):
        """This GPU's handle, set to the current stream when that changed since it was last set
        (cudnnSetStream queries the driver on every call: ~2.4 us, cudnn-frontend 1.32
        cudnn/__init__.py set_stream). Every stream this backend sets goes through here."""
        if device.type != "cuda":
            return self._handle(cudnn, device)
        if device.index is None:
            device = device_key(device)
        handle = self._handles.get(device)
        if handle is None:
            return self._handle(cudnn, device)
        stream = _current_stream(device)
        if self._streams.get(handle) != stream:
            cudnn.set_stream(handle, stream)
            self._streams[handle] = stream
        return handle

    def _handle_on_stream(self, cudnn, device: torch.device):
        """() -> this GPU's handle, set to the current stream (``_stream_handle`` with the handle
        looked up once: a launcher's)."""
        handle = self._handle(cudnn, device)
        if device.type != "cuda":
            return lambda: handle
        streams = self._streams

        def handle_now():
            stream = _current_stream(device)
            if streams.get(handle) != stream:
                cudnn.set_stream(handle, stream)
                streams[handle] = stream
            return handle

        return handle_now

    # -- exact repeats ---------------------------------------------------------
    def launcher(self, plan: CudnnPlan, batch):
        """A launch for exact repeats of ``batch`` (Backend.launcher): the variant pack bound once
        (the graph of this batch's key, its workspace, the handle, the buffer order, a wrapper's
        static index buffers), per call the operands and the function entries' index buffers
        swapped in, then one execute. None for a device scale (its value is per call and its
        sign unchecked: ``run`` keeps serving it) or a plan without its problem."""
        if plan.problem is None or _is_tensor_scale(batch.sm_scale) or _is_tensor_scale(batch.out_scale):
            return None
        if not _serves(plan, batch):
            plan = self.plan(plan.problem, batch)  # what run did for this batch: its own key's graph
        launch = self._repeat(cudnn_module(), plan, batch, _index_binders(plan, batch))
        return on_device_launch(batch.q.device, launch)

    def _repeat(self, cudnn, plan: CudnnPlan, batch, binders: list):
        """The launch closure: see ``launcher``."""
        entry, key, device = plan.entry, plan.key, device_key(batch.q.device)
        slot = {uid: i for i, uid in enumerate(entry.order)}
        template: list = [None] * len(entry.order)
        per_call = []
        for uids, value in binders:
            if callable(value):
                per_call.append((value, tuple(slot[u] for u in uids)))
            else:
                for u in uids:
                    template[slot[u]] = value  # kept alive by the closure as long as the launch
        operands = _operand_getter(key, entry.pool_views, batch.extras.get("cudnn", _NONE_GIVEN))
        operand_slots = tuple(slot[u] for u in _operand_uids(key))
        handle_now, execute = self._handle_on_stream(cudnn, device), entry.execute
        stats_slot = slot[UID_STATS] if key.lse_strides is not None else None
        fill = key.lse_padded and key.s_q > 1  # rows past a request's length: -inf
        out_scale = float(batch.out_scale)

        def launch(batch) -> None:
            buffers = template.copy()
            for i, tensor in zip(operand_slots, operands(batch)):
                buffers[i] = tensor
            for derive, slots in per_call:
                tensor = derive(batch)
                for i in slots:
                    buffers[i] = tensor
            if fill:
                buffers[stats_slot].fill_(float("-inf"))
            execute(buffers, handle_now())
            if stats_slot is not None:
                buffers[stats_slot].mul_(_numerics.LOG2E)  # cuDNN Stats are natural-log; our LSE is base 2
            if out_scale != 1.0:
                batch.out.mul_(out_scale)

        return launch

    # -- introspection (tests, probe) ----------------------------------------
    def cached_keys(self) -> list[GraphKey]:
        return list(self._graphs)
