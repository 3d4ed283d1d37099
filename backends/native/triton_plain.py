"""The plain-path attention kernel of native-triton: Hopper prefill without feature code in its loops.

Serves only the plain problem (no soft cap, ALiBi, RoPE, window, custom/xqa mask or sinks; q and K/V
of one 16-bit dtype; head dims equal, 64 or 128; one KV split), so it carries none of the general
kernel's feature arguments in its loops. Choices the plan makes (TileConfig, triton_backend.py):

* ``KV_TMA`` (ragged/dense K/V only): K and V tiles are read by TMA through two 2-D descriptors over
  the cache viewed as (rows, kv heads x head dim), made once per program on the device (Triton 3.6:
  ``tl.make_tensor_descriptor``; its scratch comes from ``triton.set_allocator``). The copy engine
  does the addressing (the cp.async gather spends per-thread address arithmetic and registers in a
  loop that is issue bound) and the tiles land in the wgmma's shared layout. A tile may run past its
  request into the next one's rows: those keys are masked, and V rows past ``hi`` are zeroed in
  masked tiles so that non-finite data there cannot leak (0 * inf). Paged K/V keep the per-key
  gather: Hopper's TMA has no row gather (Triton 3.6 lowers ``desc.gather`` to ``tile::gather4``,
  sm_100 only) and pages of 16 are smaller than a key tile.
* ``PERSISTENT``: a grid of about one wave; program p takes tiles p, p + P, ... of a list ordered
  longest causal query block first, so the heaviest work starts first and the tail is short tiles.

The interpreter runs the same kernel (tensor descriptors included) with fp32 dots (DOT_F32: its
bf16 dot is wrong in Triton 3.9). Parameters: the general kernel's (triton_kernels._attn_fwd), so the
backend's argument builders and launcher serve both, but for the three plan-fixed ints, which are
(query blocks, batch size, kv heads) here; the feature pointers (NVFP4 scale factors among them) arrive
as None and are unused.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import LOG2E, _finish_rows, _load_q, _qk


@triton.jit
def _key_offsets(n, n_ok, b, kv_start, BlockTable, stride_bt, stride_kp, stride_kt, stride_vp, stride_vt,
                 PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr):
    """(K, V) element offsets of keys n: through the page table when paged (its entry read unmasked on
    interior tiles), else rows kv_start + n."""
    if PAGED:
        if MASKED:
            page = tl.load(BlockTable + b * stride_bt + n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        else:
            page = tl.load(BlockTable + b * stride_bt + n // PAGE_SIZE).to(tl.int64)
        slot = n % PAGE_SIZE
        k_off = page * stride_kp + slot * stride_kt
        v_off = page * stride_vp + slot * stride_vt
    else:
        k_off = (kv_start + n).to(tl.int64) * stride_kt
        v_off = (kv_start + n).to(tl.int64) * stride_vt
    return k_off, v_off


@triton.jit
def _v_tile(V, v_off, kvh, stride_vh, stride_vd, d, n_ok, MASKED: tl.constexpr):
    """The V tile (BLOCK_N, D) at the keys' offsets; MASKED: keys past the end read as 0."""
    v_ptr = V + v_off[:, None] + kvh * stride_vh + d[None, :] * stride_vd
    if MASKED:
        v = tl.load(v_ptr, mask=n_ok[:, None], other=0.0)
    else:
        v = tl.load(v_ptr)
    return v


@triton.jit
def _plain_kv(K, V, k_desc, v_desc, b, kvh, kv_start, start, hi, BlockTable, stride_bt, stride_kp, stride_kt,
              stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, BLOCK_N: tl.constexpr,
              HEAD_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, KV_TMA: tl.constexpr,
              MASKED: tl.constexpr):
    """(K tile transposed (D, BLOCK_N), V tile (BLOCK_N, D)) of keys start + j; MASKED: keys >= hi read as 0."""
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_D)
    n_ok = n < hi
    if KV_TMA:
        kt = k_desc.load([kv_start + start, kvh * HEAD_D]).T
        v = v_desc.load([kv_start + start, kvh * HEAD_D])
        if MASKED:  # rows of the next request (or zeros past the tensor): never let them reach acc
            v = tl.where(n_ok[:, None], v, 0.0)
    else:
        k_off, v_off = _key_offsets(n, n_ok, b, kv_start, BlockTable, stride_bt, stride_kp, stride_kt, stride_vp,
                                    stride_vt, PAGED, PAGE_SIZE, MASKED)
        k_ptr = K + k_off[None, :] + kvh * stride_kh + d[:, None] * stride_kd
        if MASKED:
            kt = tl.load(k_ptr, mask=n_ok[None, :], other=0.0)
        else:
            kt = tl.load(k_ptr)
        v = _v_tile(V, v_off, kvh, stride_vh, stride_vd, d, n_ok, MASKED)
    return kt, v


@triton.jit
def _plain_scores(q, kt, DOT_F32: tl.constexpr):
    if DOT_F32:
        s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    return s


@triton.jit
def _plain_step(q, m_i, l_i, acc, s, v, start, hi, pos, row_ok, c, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, DOT_F32: tl.constexpr, MASKED: tl.constexpr):
    """One key tile's scores s folded into the online softmax, log2 domain; c = scale * log2(e) >= 0 is
    applied inside one FMA per element (s * c - m) on unmasked tiles."""
    if MASKED:
        n = start + tl.arange(0, BLOCK_N)
        keep = row_ok[:, None] & (n < hi)[None, :]
        if CAUSAL:
            keep = keep & (n[None, :] <= pos[:, None])
        s = tl.where(keep, s * c, float("-inf"))  # scaled before masking: (-inf) * 0 is NaN for scale 0
        c = 1.0
    m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s * c - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_F32:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(q.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _plain_rope_tile(q, q2, K, V, f_hi, f_lo, b, kvh, kv_start, start, hi, BlockTable, stride_bt, stride_kp,
                     stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                     BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                     DOT_F32: tl.constexpr, MASKED: tl.constexpr):
    """(scores, V tile) of keys start + j with RoPE: K's halves rotated at the key positions inside the
    general kernel's _qk (q, q2: the rotated query halves); V by the same per-key offsets."""
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_D)
    n_ok = n < hi
    k_off, v_off = _key_offsets(n, n_ok, b, kv_start, BlockTable, stride_bt, stride_kp, stride_kt, stride_vp,
                                stride_vt, PAGED, PAGE_SIZE, MASKED)
    s = _qk(q, q2, K, k_off, kvh, stride_kh, stride_kd, start, n, n_ok, f_hi, f_lo, HEAD_D, HEAD_D, HEAD_D // 2,
            BLOCK_N, True, MASKED, DOT_F32, K, k_off, 0, False)
    v = _v_tile(V, v_off, kvh, stride_vh, stride_vd, d, n_ok, MASKED)
    return s, v


@triton.jit
def _plain_tile(q, q2, K, V, k_desc, v_desc, f_hi, f_lo, b, kvh, kv_start, start, hi, BlockTable, stride_bt,
                stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                KV_TMA: tl.constexpr, ROPE: tl.constexpr, DOT_F32: tl.constexpr, MASKED: tl.constexpr):
    """(scores, V tile) of keys start + j (one return at the end: see _qk on constexpr branches)."""
    if ROPE:
        s, v = _plain_rope_tile(q, q2, K, V, f_hi, f_lo, b, kvh, kv_start, start, hi, BlockTable, stride_bt,
                                stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh,
                                stride_vd, BLOCK_N, HEAD_D, PAGED, PAGE_SIZE, DOT_F32, MASKED)
    else:
        kt, v = _plain_kv(K, V, k_desc, v_desc, b, kvh, kv_start, start, hi, BlockTable, stride_bt, stride_kp,
                          stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, BLOCK_N,
                          HEAD_D, PAGED, PAGE_SIZE, KV_TMA, MASKED)
        s = _plain_scores(q, kt, DOT_F32)
    return s, v


@triton.jit
def _plain_block(Q, K, V, Out, Lse, k_desc, v_desc, QoIndptr, KvLens, KvIndptr, BlockTable, RopeFreq, sm_scale,
                 out_scale,
                 pid_m, pid_bh, num_kv_heads, stride_qt, stride_qh, stride_qd, stride_kp, stride_kt, stride_kh,
                 stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_ot, stride_oh, stride_od, stride_lt,
                 stride_lh, stride_bt, GROUP: tl.constexpr, HPP: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 CAUSAL: tl.constexpr, DOT_F32: tl.constexpr, KV_TMA: tl.constexpr, ROPE: tl.constexpr,
                 WRITE_LSE: tl.constexpr, SCALE_PTR: tl.constexpr, OUT_SCALE_PTR: tl.constexpr):
    """Query block pid_m (BLOCK_M rows = tokens x HPP heads of one KV group) of request/head pid_bh:
    the unmasked interior keys, then the causal diagonal and the request's end, then the output.
    ROPE: q's and each K tile's halves rotated at their positions (no rotated copies)."""
    HGROUPS: tl.constexpr = GROUP // HPP
    b = pid_bh // (num_kv_heads * HGROUPS)
    kvh = (pid_bh // HGROUPS) % num_kv_heads
    head0 = kvh * GROUP + (pid_bh % HGROUPS) * HPP
    q_start = tl.load(QoIndptr + b)
    q_len = tl.load(QoIndptr + b + 1) - q_start
    kv_len = tl.load(KvLens + b)
    t_first = (pid_m * BLOCK_M) // HPP
    if t_first < q_len:  # the grid is sized by the longest request (no early return: called in a loop)
        t_last = tl.minimum(((pid_m + 1) * BLOCK_M - 1) // HPP, q_len - 1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        t = rows // HPP
        h = head0 + rows % HPP
        row_ok = t < q_len
        pos = kv_len - q_len + t  # bottom-right alignment
        tok = (q_start + t).to(tl.int64)
        hi = kv_len
        hi_full = kv_len
        if CAUSAL:
            hi = tl.minimum(hi, kv_len - q_len + t_last + 1)
            hi_full = tl.minimum(hi, kv_len - q_len + t_first + 1)
        hi_full = tl.maximum(hi_full, 0) // BLOCK_N * BLOCK_N
        kv_start = 0
        if not PAGED:
            kv_start = tl.load(KvIndptr + b)
        if SCALE_PTR:
            scale = tl.load(sm_scale).to(tl.float32)
        else:
            scale = sm_scale
        q, q2, f_hi, f_lo, q_inv = _load_q(Q, RopeFreq, tok, h, row_ok, pos, stride_qt, stride_qh, stride_qd,
                                           HEAD_D, HEAD_D, HEAD_D // 2, ROPE, DOT_F32, False)
        q = tl.where(scale < 0, -q, q)  # softmax(s * c) for c < 0 is softmax(|c| * (-q).k): exact
        q2 = tl.where(scale < 0, -q2, q2)
        c = tl.abs(scale) * LOG2E
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
        for start in range(0, hi_full, BLOCK_N):  # interior: every row sees every key
            s, v = _plain_tile(q, q2, K, V, k_desc, v_desc, f_hi, f_lo, b, kvh, kv_start, start, hi, BlockTable,
                               stride_bt, stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh,
                               stride_vd, BLOCK_N, HEAD_D, PAGED, PAGE_SIZE, KV_TMA, ROPE, DOT_F32, False)
            m_i, l_i, acc = _plain_step(q, m_i, l_i, acc, s, v, start, hi, pos, row_ok, c, BLOCK_N, CAUSAL,
                                        DOT_F32, False)
        for start in range(hi_full, hi, BLOCK_N):  # causal diagonal and the request's end
            s, v = _plain_tile(q, q2, K, V, k_desc, v_desc, f_hi, f_lo, b, kvh, kv_start, start, hi, BlockTable,
                               stride_bt, stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh,
                               stride_vd, BLOCK_N, HEAD_D, PAGED, PAGE_SIZE, KV_TMA, ROPE, DOT_F32, True)
            m_i, l_i, acc = _plain_step(q, m_i, l_i, acc, s, v, start, hi, pos, row_ok, c, BLOCK_N, CAUSAL,
                                        DOT_F32, True)
        _finish_rows(acc, m_i, l_i, h, tok, row_ok, tl.arange(0, HEAD_D), Out, Lse, Lse, out_scale,
                     stride_ot, stride_oh, stride_od, stride_lt, stride_lh, HEAD_D, False, WRITE_LSE, OUT_SCALE_PTR)


@triton.jit
def _kv_descriptors(K, V, KvIndptr, batch_size, num_kv_heads, stride_kt, stride_vt, BLOCK_N: tl.constexpr,
                    HEAD_D: tl.constexpr, KV_TMA: tl.constexpr):
    """The K and V descriptors over (rows, kv heads x head dim), rows = the batch's keys (TMA reads
    zeros past them), or (K, V) themselves when the tiles are gathered by pointers."""
    if KV_TMA:
        rows = tl.load(KvIndptr + batch_size)
        width = num_kv_heads * HEAD_D
        k_desc = tl.make_tensor_descriptor(K, shape=[rows, width], strides=[stride_kt, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
        v_desc = tl.make_tensor_descriptor(V, shape=[rows, width], strides=[stride_vt, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
    else:
        k_desc = K
        v_desc = V
    return k_desc, v_desc


# Integers that change with the batch every step are not specialized on (see triton_kernels._attn_fwd).
@triton.jit(do_not_specialize=["m_blocks", "batch_size", "stride_bt", "stride_ps", "stride_ls"])
def _attn_fwd_plain(
    Q, K, V, Out, Lse, PartO, PartLse, SplitCount,
    QoIndptr, KvLens, KvIndptr, BlockTable, VBlockTable, Sinks, CustomMask, MaskIndptr, SpecMask, Alibi, RopeFreq,
    KSf, VSf, sm_scale, out_scale, soft_cap,
    m_blocks, batch_size, num_kv_heads,
    stride_qt, stride_qh, stride_qd,
    stride_kp, stride_kt, stride_kh, stride_kd,
    stride_vp, stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_lt, stride_lh, stride_bt, stride_spec_b, stride_spec, spec_ragged,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lst,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    GROUP: tl.constexpr, HPP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, DOT_F32: tl.constexpr,
    KV_TMA: tl.constexpr, PERSISTENT: tl.constexpr, ROPE: tl.constexpr,
    WRITE_LSE: tl.constexpr, SCALE_PTR: tl.constexpr, OUT_SCALE_PTR: tl.constexpr,
):
    k_desc, v_desc = _kv_descriptors(K, V, KvIndptr, batch_size, num_kv_heads, stride_kt, stride_vt, BLOCK_N,
                                     HEAD_D, KV_TMA)
    if PERSISTENT:
        # Tiles ordered longest causal query block first (m-block descending, all heads and requests of
        # one m-block together); program p takes every P-th, so each program's work is about equal.
        bh_count = batch_size * num_kv_heads * (GROUP // HPP)
        for tile in range(tl.program_id(0), m_blocks * bh_count, tl.num_programs(0)):
            pid_m = m_blocks - 1 - tile // bh_count
            _plain_block(Q, K, V, Out, Lse, k_desc, v_desc, QoIndptr, KvLens, KvIndptr, BlockTable, RopeFreq, sm_scale,
                         out_scale, pid_m, tile % bh_count, num_kv_heads, stride_qt, stride_qh, stride_qd,
                         stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                         stride_ot, stride_oh, stride_od, stride_lt, stride_lh, stride_bt, GROUP, HPP, BLOCK_M,
                         BLOCK_N, HEAD_D, PAGED, PAGE_SIZE, CAUSAL, DOT_F32, KV_TMA, ROPE, WRITE_LSE, SCALE_PTR,
                         OUT_SCALE_PTR)
    else:
        pid_m = tl.program_id(0)
        if CAUSAL:  # the last query blocks see the most keys: launch them first
            pid_m = tl.num_programs(0) - 1 - pid_m
        _plain_block(Q, K, V, Out, Lse, k_desc, v_desc, QoIndptr, KvLens, KvIndptr, BlockTable, RopeFreq, sm_scale,
                     out_scale, pid_m, tl.program_id(1), num_kv_heads, stride_qt, stride_qh, stride_qd,
                     stride_kp, stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd,
                     stride_ot, stride_oh, stride_od, stride_lt, stride_lh, stride_bt, GROUP, HPP, BLOCK_M,
                     BLOCK_N, HEAD_D, PAGED, PAGE_SIZE, CAUSAL, DOT_F32, KV_TMA, ROPE, WRITE_LSE, SCALE_PTR,
                     OUT_SCALE_PTR)
