"""Triton kernels of the native-triton backend (imported lazily: triton is optional).

One attention kernel serves every phase and KV storage; constexpr flags compile
out what a problem does not use, so each configuration gets a lean specialization.

* Tile = BLOCK_M rows x BLOCK_N keys. A row is one (query token, query head) pair:
  row r is token ``r // HPP`` and head ``r % HPP`` of the program's head slice, so
  with HPP = GQA group (decode) the whole group shares one K/V read and the tile
  is tall enough for tensor cores; with HPP = 1 (prefill) rows are tokens.
* Scores live in the log2 domain (exp2 is one MUFU op): s2 = s * log2(e).
* Split-KV (flash-decoding): program z handles keys [z*kv_chunk, (z+1)*kv_chunk), counted
  from the tile holding the program's first visible key under a window (the splits then share
  the window's keys, not the whole sequence's: triton_backend.split_span), and writes a
  normalized partial output + its log2-sum-exp; ``_merge_splits`` (a second
  launch) combines them (and adds the sinks, which must be counted once), or, where the plan
  asks (MERGE_BLOCK_S > 0: TileConfig.fused_merge, decode tiles), the row block's last program.
* ROPE: LLaMA rotate-half applied in registers, q once per program and each K tile as it is
  loaded: the dot runs as two half-width dots (first halves, then second halves), so K is read
  once and nothing rotated is written. Angles are formed in double-float (fp32 hi + lo parts of
  the frequency from the host's fp64, fma for the product residual) because positions of 10^5
  times fp32 frequencies lose ~1e-2 rad; the reference forms them in fp64.
* FIXUP (a vendor decode's fix-up, backends/xqa.py): each program first bounds its rows' logits at
  their own position (the key every row sees) and returns at once when every bound is within
  FIXUP_LOGIT; otherwise it computes its rows as usual (one split), overwriting the vendor's output.
* NVFP4 K/V (constexpr NVFP4; backends/native/nvfp4.py has the format): each K and V tile is
  dequantized where it is loaded, its bytes and fp8 scale factors to fp16 values in registers
  (integer bit assembly: no table, no fp8 hardware; the values are exact in fp16), the dots' dtype
  (F16_DOTS). The global scales are the entry's sm_scale / out_scale factors.
* Every index tensor is read on the device: no host synchronization, CUDA-graph safe.
* Parameter order is fixed by the host's fast launcher (triton_backend.py): pointers and floats,
  then ints, then the plan's constexprs, then the two per-call constexprs (SCALE_PTR, OUT_SCALE_PTR).
"""
from __future__ import annotations

import math
import os

import triton
import triton.language as tl

from backends import _numerics

LOG2E = tl.constexpr(_numerics.LOG2E)  # a constexpr global: jitted code may read it
# RoPE angles are reduced to [-pi, pi] with 2*pi in two fp32 parts (Cody-Waite; the fma keeps k * hi exact).
TWO_PI_HI = tl.constexpr(6.2831854820251465)  # float32(2 pi)
TWO_PI_LO = tl.constexpr(2 * math.pi - 6.2831854820251465)
INV_TWO_PI = tl.constexpr(1 / (2 * math.pi))
# Compiled: cos/sin of reduced angles on the SFU (cos.approx/sin.approx, abs. error 2^-20.5 on [-pi, pi]).
# tl.cos/tl.sin compile to libdevice's full-range cosf/sinf: ~40 instructions, branches and a
# local-memory slow path per element (the fused-RoPE kernel spilled 1.5 KB and ran 10x slower).
# The interpreter cannot run inline PTX and uses numpy's cos/sin on the same reduced angles.
FAST_TRIG = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")
# FIXUP: a row whose logit at its own position is provably within +-FIXUP_LOGIT has its row max there or
# above. XQA starts its row max at -1e5 and gives masked keys that logit (csrc/xqa/utils.cuh
# safeInitRowMax), so it is exact for such rows; 10x below that, e4m3 rounding of q (7%) included.
FIXUP_LOGIT = tl.constexpr(1e4)


@triton.jit
def _tanh(x):
    # 1 - 2 / (exp(2x) + 1): saturates cleanly to +-1 (exp overflow -> inf -> 1).
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _e4m3_grid(x):
    """fp32 x rounded to the nearest fp8 e4m3 value (ties to even) and saturated at +-448, still fp32: the
    value FlashInfer 0.7.2 stores for an fp8 output. Its kernels convert with the saturating conversion
    (include/flashinfer/vec_dtypes.cuh vec_cast<__nv_fp8_e4m3, float>: __NV_SATFINITE; XQA's
    csrc/xqa/utils.cuh convert<__nv_fp8_e4m3>: the __nv_fp8x2_e4m3 constructor, also satfinite; PTX has
    no other f32 -> e4m3 conversion), so a value past 448 (inf too) stores 448 (as torch's own conversion
    does), never NaN; NaN stays NaN. Rounded here, the cast that follows is exact on every
    path: Triton's compiled cast (one cvt, or two through fp16 on some targets) and its interpreter's
    (which truncates and does not saturate). Spacing 2^(e - 3) for |x| in [2^e, 2^(e+1)), 2^-9 below
    2^-6 (the subnormals); adding and taking off 2^23 rounds |x| / spacing (< 16) to an integer."""
    a = tl.abs(x)
    a = tl.where(a > 448.0, 448.0, a)  # a NaN compares false and stays
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    spacing = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - e + 3) << 23).to(tl.float32, bitcast=True)
    a = ((a * inverse + 8388608.0) - 8388608.0) * spacing
    return tl.where(x < 0, -a, a)


@triton.jit
def _out_values(out, Out):
    """out in Out's dtype; an fp8 e4m3 output as FlashInfer stores it (_e4m3_grid)."""
    if Out.dtype.element_ty == tl.float8e4nv:
        out = _e4m3_grid(out)
    return out.to(Out.dtype.element_ty)


@triton.jit
def _custom_mask_tile(CustomMask, MaskIndptr, b, t, t_first, q_len, kv_len, start, hi,
                      BLOCK_M: tl.constexpr, HPP: tl.constexpr, BLOCK_N: tl.constexpr):
    """The custom bool mask's bytes for key tile ``start``: a row per token when the tile's rows are whole
    tokens of HPP heads (row r is token r // HPP; _keep_mask broadcasts it), else a row per row.

    Why per token: the mask's rows start at any byte (q x kv bytes per request), so each element is a byte
    load with its own 64-bit address; per row that was 128 registers per thread at M256 and spilled
    4.4 KB (H100 custom-mask prefill 8 x 2048: 15 TFLOP/s against 318 unmasked)."""
    n = start + tl.arange(0, BLOCK_N)
    mask_row = CustomMask + tl.load(MaskIndptr + b).to(tl.int64)
    if BLOCK_M % HPP == 0:
        tt = t_first + tl.arange(0, BLOCK_M // HPP)
    else:
        tt = t
    return tl.load(mask_row + tt[:, None].to(tl.int64) * kv_len + n[None, :],
                   mask=(tt < q_len)[:, None] & (n < hi)[None, :], other=0)


@triton.jit
def _keep_mask(n, n_ok, t, row_ok, pos, b, q_start, q_len, kv_len, window_left,
               mask_tile, SpecMask, stride_spec_b, stride_spec, spec_ragged,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASK_MODE: tl.constexpr,
               BLOCK_M: tl.constexpr, HPP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Which (row, key) pairs are visible. MASK_MODE 0 none, 1 custom bool (``mask_tile``, loaded by
    _custom_mask_tile), 2 xqa bits."""
    keep = row_ok[:, None] & n_ok[None, :]
    if CAUSAL:
        keep = keep & (n[None, :] <= pos[:, None])
    if HAS_WINDOW:
        keep = keep & (n[None, :] >= pos[:, None] - window_left)
    if MASK_MODE == 1:
        if HPP > 1 and BLOCK_M % HPP == 0:  # a row per token: each token's row serves its HPP heads
            kept = tl.reshape(tl.broadcast_to(mask_tile[:, None, :], (BLOCK_M // HPP, HPP, BLOCK_N)),
                              (BLOCK_M, BLOCK_N))
        else:
            kept = mask_tile
        keep = keep & (kept != 0)
    if MASK_MODE == 2:
        # Drafts are the last q_len keys; the prefix before them is always visible.
        j = n - (kv_len - q_len)
        draft = j >= 0
        jj = tl.maximum(j, 0)
        # (B, Q, W) masks: row b*stride_spec_b + t; ragged (total_q, W): row q_start + t.
        row = b.to(tl.int64) * stride_spec_b + (q_start * spec_ragged + t)[:, None].to(tl.int64) * stride_spec
        word_ptr = SpecMask + row + (jj // 16)[None, :]
        word = tl.load(word_ptr, mask=keep & draft[None, :], other=0).to(tl.int32) & 0xFFFF
        bit = (word >> (jj % 16)[None, :]) & 1
        keep = keep & ((~draft)[None, :] | (bit != 0))
    return keep


@triton.jit
def _scores(s, n, t, scale, soft_cap, slope, HAS_ALIBI: tl.constexpr, SOFT_CAP: tl.constexpr):
    """Raw q.k in the log2 domain: scale, ALiBi bias, soft cap (in FlashInfer's order), * log2(e)."""
    s = s * scale
    if HAS_ALIBI:  # FlashInfer: slope * (kv_idx - qo_idx), qo_idx the row within the request
        s += slope[:, None] * (n[None, :] - t[:, None]).to(tl.float32)
    if SOFT_CAP:
        s = soft_cap * _tanh(s / soft_cap)
    return s * LOG2E


@triton.jit
def _cos_sin_reduced(r):
    """cos and sin of angles in [-pi, pi] (see FAST_TRIG), or a few dozen radians beyond (key tiles, see
    _rope_cos_sin_tile): the SFU multiplies by 1/(2 pi) in fp32 first, so its error grows as |r| * 2^-24."""
    if FAST_TRIG:
        c = tl.inline_asm_elementwise("cos.approx.ftz.f32 $0, $1;", "=f,f", [r], dtype=tl.float32, is_pure=True,
                                      pack=1)
        sn = tl.inline_asm_elementwise("sin.approx.ftz.f32 $0, $1;", "=f,f", [r], dtype=tl.float32, is_pure=True,
                                       pack=1)
    else:
        c = tl.cos(r)
        sn = tl.sin(r)
    return c, sn


@triton.jit
def _rope_angle(p, f_hi, f_lo):
    """The angle p * (f_hi + f_lo) reduced to [-pi, pi] (broadcast shapes; p holds exact integer
    positions < 2^24). The product is kept as fp32 hi + lo (fma residual; at 10^5 positions plain fp32
    loses ~1e-2 rad), then whole turns are taken off: ~9 ALU ops, absolute error ~1e-6."""
    a = p * f_hi
    a_lo = tl.fma(p, f_hi, -a) + p * f_lo
    k = tl.floor(a * INV_TWO_PI + 0.5)  # whole turns (k * TWO_PI_HI is exact inside the fma)
    r = tl.fma(-k, TWO_PI_HI, a)
    return tl.fma(-k, TWO_PI_LO, r) + a_lo


@triton.jit
def _rope_cos_sin(p, f_hi, f_lo):
    """cos and sin of the angle p * (f_hi + f_lo), reduced per element (see _rope_angle)."""
    return _cos_sin_reduced(_rope_angle(p, f_hi, f_lo))


@triton.jit
def _rope_cos_sin_tile(start, f_hi, f_lo, BLOCK_N: tl.constexpr):
    """cos and sin, (BLOCK_HALF, BLOCK_N), of the angles of keys start + j, j < BLOCK_N: the tile start's
    angle is reduced once per frequency, then each key adds j * f in one fma (no per-element
    reduction: the angle work per (key, frequency) drops from ~9 ALU ops to 1, which the prefill
    loop's issue rate pays for). |r| <= pi + BLOCK_N * max f, so the fp32 rounding of r and the SFU's
    own reduction add ~|r| * 2^-24 rad: ~1e-5 at BLOCK_N 128, far below 16-bit K's rounding; fp32
    inputs (tolerance 1e-5) keep _rope_cos_sin."""
    r0 = _rope_angle(tl.cast(start, tl.float32), f_hi, f_lo)  # start is a Python int in the interpreter
    j = tl.arange(0, BLOCK_N).to(tl.float32)
    return _cos_sin_reduced(tl.fma(j[None, :], f_hi[:, None], r0[:, None]))


@triton.jit
def _e2m1(code):
    """fp4 e2m1 codes (int32, 0-15) -> fp16: exponent field e (2 bits), mantissa m (1 bit), sign bit 3;
    m / 2 when e == 0, else (1 + m / 2) * 2^(e - 1), assembled as fp16 bits."""
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e == 0, m * 0x3800, ((e + 14) << 10) | (m << 9)) | ((code & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _e4m3(byte):
    """fp8 e4m3 bytes (int32) -> fp16 (exact: e4m3 is within fp16's range and precision): exponent
    field e (4 bits, bias 7), mantissa m (3 bits), sign bit 7; m * 2^-9 when e == 0 (subnormal),
    else (1 + m / 8) * 2^(e - 7)."""
    e = (byte >> 3) & 15
    m = byte & 7
    normal = ((((e + 8) << 10) | (m << 7)) | ((byte & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True)
    sub = m.to(tl.float16) * 0.001953125
    return tl.where(e == 0, tl.where((byte & 0x80) != 0, -sub, sub), normal)


@triton.jit
def _fp4_values(X, Sf, d, stride_d, ok):
    """NVFP4 values (fp16, exact) of the rows at X (packed bytes) and Sf (their scale factors), both
    already offset to each row (broadcast against d), at value indices d along the head dim: byte
    d // 2 (stride_d apart), its low nibble for even d, one scale factor per 16 values (unit stride)."""
    byte = tl.load(X + (d // 2) * stride_d, mask=ok, other=0).to(tl.int32)
    code = (byte >> ((d % 2) * 4)) & 15
    sf = tl.load(Sf + d // 16, mask=ok, other=0).to(tl.int32)
    return _e2m1(code) * _e4m3(sf)


@triton.jit
def _fp4_rows(X, Sf, row_ok, stride_d, D0: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
              ROWS: tl.constexpr, MASKED: tl.constexpr):
    """(ROWS, BLOCK) fp16 (exact): values D0 + j, j < WIDTH (zeros beyond), of the NVFP4 rows whose
    packed bytes start at X and scale factors at Sf ((ROWS, 1) pointers); D0 and WIDTH multiples of 16,
    row_ok read when MASKED. Each byte and scale factor is loaded once and expanded in registers
    (nibbles interleaved, each block of 16 scaled), in fp16, the dots' dtype: _fp4_values' pointer per
    value, and fp32 tiles, held the tile in registers (sm_90, M128 N64 d128: 1.9 KB of spills)."""
    jb = tl.arange(0, BLOCK // 2)
    js = tl.arange(0, BLOCK // 16)
    byte_ptr = X + (D0 // 2 + jb[None, :]) * stride_d
    sf_ptr = Sf + D0 // 16 + js[None, :]
    if MASKED:
        byte = tl.load(byte_ptr, mask=row_ok[:, None] & (jb[None, :] < WIDTH // 2), other=0)
        sf = tl.load(sf_ptr, mask=row_ok[:, None] & (js[None, :] < WIDTH // 16), other=0)
    elif BLOCK == WIDTH:
        byte = tl.load(byte_ptr)
        sf = tl.load(sf_ptr)
    else:
        byte = tl.load(byte_ptr, mask=jb[None, :] < WIDTH // 2, other=0)
        sf = tl.load(sf_ptr, mask=js[None, :] < WIDTH // 16, other=0)
    byte = byte.to(tl.int32)
    values = tl.interleave(_e2m1(byte & 15), _e2m1(byte >> 4))  # element 2i: the low nibble
    scaled = tl.reshape(values, (ROWS, BLOCK // 16, 16)) * _e4m3(sf.to(tl.int32))[:, :, None]
    return tl.reshape(scaled, (ROWS, BLOCK))


@triton.jit
def _qk(q, q2, K, k_off, kvh, stride_kh, stride_kd, start, n, n_ok, f_hi, f_lo,
        HEAD_DQK: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_N: tl.constexpr,
        ROPE: tl.constexpr, MASKED: tl.constexpr, DOT_F32: tl.constexpr, KSf, ksf_off, stride_ksh,
        NVFP4: tl.constexpr):
    """Raw scores q.k of one key tile (keys n = start + j, fp32). ROPE: q holds the rotated first halves,
    q2 the second halves; each K half is rotated at key positions n and the two half-width dots are summed.
    One return, at the end: compiled Triton generates (and type-checks) the statements after a
    ``return`` nested in a constexpr ``if`` (the interpreter never reaches them), so each variant
    lives in its own branch (tests/test_native_ir.py builds every variant's IR).
    NVFP4: K holds packed bytes and KSf their scale factors (ksf_off: the keys' rows in it)."""
    if ROPE:
        HALF: tl.constexpr = HEAD_DQK // 2
        dh = tl.arange(0, BLOCK_HALF)
        k1_ptr = K + k_off[None, :] + kvh * stride_kh + dh[:, None] * stride_kd
        k2_ptr = k1_ptr + HALF * stride_kd
        # Interior tiles of power-of-two heads load unmasked (a mask varying along the head dim
        # would split the copies into single elements).
        if NVFP4 and HALF % 16 == 0:  # each half whole scale blocks
            k_row = K + k_off[:, None] + kvh * stride_kh
            sf_row = KSf + ksf_off[:, None] + kvh * stride_ksh
            k1 = tl.trans(_fp4_rows(k_row, sf_row, n_ok, stride_kd, 0, HALF, BLOCK_HALF, BLOCK_N, MASKED))
            k2 = tl.trans(_fp4_rows(k_row, sf_row, n_ok, stride_kd, HALF, HALF, BLOCK_HALF, BLOCK_N, MASKED))
            k1, k2 = k1.to(tl.float32), k2.to(tl.float32)
        elif NVFP4:  # a scale block straddles the halves (head_dim an odd multiple of 16)
            ok = dh[:, None] < HALF
            if MASKED:
                ok = ok & n_ok[None, :]
            k_row = K + k_off[None, :] + kvh * stride_kh
            sf_row = KSf + ksf_off[None, :] + kvh * stride_ksh
            k1 = _fp4_values(k_row, sf_row, dh[:, None], stride_kd, ok).to(tl.float32)
            k2 = _fp4_values(k_row, sf_row, dh[:, None] + HALF, stride_kd, ok).to(tl.float32)
        elif MASKED:
            ok = (dh[:, None] < HALF) & n_ok[None, :]
            k1 = tl.load(k1_ptr, mask=ok, other=0.0).to(tl.float32)
            k2 = tl.load(k2_ptr, mask=ok, other=0.0).to(tl.float32)
        elif BLOCK_HALF == HALF:
            k1 = tl.load(k1_ptr).to(tl.float32)
            k2 = tl.load(k2_ptr).to(tl.float32)
        else:
            k1 = tl.load(k1_ptr, mask=dh[:, None] < HALF, other=0.0).to(tl.float32)
            k2 = tl.load(k2_ptr, mask=dh[:, None] < HALF, other=0.0).to(tl.float32)
        if DOT_F32:
            c, sn = _rope_cos_sin(n.to(tl.float32)[None, :], f_hi[:, None], f_lo[:, None])
        else:
            c, sn = _rope_cos_sin_tile(start, f_hi, f_lo, BLOCK_N)
        r1 = k1 * c - k2 * sn
        r2 = k2 * c + k1 * sn
        if DOT_F32:
            s = tl.dot(q2, r2, tl.dot(q, r1, input_precision="ieee"), input_precision="ieee")
        else:
            s = tl.dot(q2, r2.to(q2.dtype), tl.dot(q, r1.to(q.dtype)))
    else:
        dk = tl.arange(0, BLOCK_DQK)
        k_ptr = K + k_off[None, :] + kvh * stride_kh + dk[:, None] * stride_kd
        if NVFP4:
            k = tl.trans(_fp4_rows(K + k_off[:, None] + kvh * stride_kh, KSf + ksf_off[:, None] + kvh * stride_ksh,
                                   n_ok, stride_kd, 0, HEAD_DQK, BLOCK_DQK, BLOCK_N, MASKED))
        elif MASKED:
            k = tl.load(k_ptr, mask=n_ok[None, :] & (dk[:, None] < HEAD_DQK), other=0.0)
        elif BLOCK_DQK == HEAD_DQK:
            k = tl.load(k_ptr)
        else:
            k = tl.load(k_ptr, mask=dk[:, None] < HEAD_DQK, other=0.0)
        if DOT_F32:  # fp32 inputs, and the interpreter (its bf16 dot is wrong in Triton 3.9)
            s = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k.to(q.dtype))
    return s


@triton.jit
def _v_to_dot(v, dtype: tl.constexpr):
    """The V tile (keys x dims) in the dot's dtype. fp8 -> fp16: converted in pairs along the head dim
    through a reshape, which keeps Triton from moving the conversion after the shared-memory read in
    the dot layout (there the keys a thread needs are not adjacent: one byte load and a repack per
    value, 128 per thread and tile in the fp8 decode kernel); so it converts in the loaded layout
    (one cvt per two values) and reads fp16 with ldmatrix. (K needs no such help: its dot reads
    pairs along the head dim, which is contiguous.)"""
    if v.dtype.primitive_bitwidth == 8 and dtype == tl.float16:
        pairs = tl.reshape(v, (v.shape[0], v.shape[1] // 2, 2)).to(dtype)
        w = tl.reshape(pairs, (v.shape[0], v.shape[1]))
    else:
        w = v.to(dtype)
    return w


@triton.jit
def _tile(q, q2, m_i, l_i, acc, start, hi, t, row_ok, pos, b, kvh, q_start, q_len, kv_len, kv_start, window_left,
          scale, soft_cap, slope, f_hi, f_lo, K, V, BlockTable, VBlockTable, stride_bt, stride_kp, stride_kt,
          stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, mask_tile, SpecMask, stride_spec_b,
          stride_spec, spec_ragged, KSf, VSf, stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst,
          stride_vsh, BLOCK_N: tl.constexpr, HEAD_DQK: tl.constexpr, HEAD_DV: tl.constexpr,
          BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_HALF: tl.constexpr, PAGED: tl.constexpr,
          PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFT_CAP: tl.constexpr,
          MASK_MODE: tl.constexpr, HAS_ALIBI: tl.constexpr, ROPE: tl.constexpr, DOT_F32: tl.constexpr,
          MASKED: tl.constexpr, BLOCK_M: tl.constexpr, HPP: tl.constexpr, NVFP4: tl.constexpr,
          V_TABLE: tl.constexpr):
    """One BLOCK_N tile of keys folded into the online softmax (m_i, l_i, acc), log2 domain.
    MASKED=False: the caller guarantees every key is < hi and visible to every row. NVFP4: K/V hold
    packed bytes, KSf/VSf their scale factors (strides: page, token, head), read at the same keys.
    V_TABLE: V's page ids come from VBlockTable (same row stride as BlockTable), K's from BlockTable."""
    n = start + tl.arange(0, BLOCK_N)
    dv = tl.arange(0, BLOCK_DV)
    n_ok = n < hi
    if PAGED:  # one block-table lookup serves K and V (V_TABLE: a second one serves V)
        # Interior tiles read the table unmasked (every key < hi): the masked loads cost ~40 predicate
        # instructions per tile in the prefill loop; the slot term stays 32-bit (< one page's stride).
        if MASKED:
            page = tl.load(BlockTable + b * stride_bt + n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        else:
            page = tl.load(BlockTable + b * stride_bt + n // PAGE_SIZE).to(tl.int64)
        v_page = page
        if V_TABLE:  # K and V pages with ids of their own (TensorRT-LLM's separate page tables)
            if MASKED:
                v_page = tl.load(VBlockTable + b * stride_bt + n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
            else:
                v_page = tl.load(VBlockTable + b * stride_bt + n // PAGE_SIZE).to(tl.int64)
        slot = n % PAGE_SIZE
        k_off = page * stride_kp + slot * stride_kt
        v_off = v_page * stride_vp + slot * stride_vt
        ksf_off = page * stride_ksp + slot * stride_kst
        vsf_off = v_page * stride_vsp + slot * stride_vst
    else:
        k_off = (kv_start + n).to(tl.int64) * stride_kt
        v_off = (kv_start + n).to(tl.int64) * stride_vt
        ksf_off = (kv_start + n).to(tl.int64) * stride_kst
        vsf_off = (kv_start + n).to(tl.int64) * stride_vst
    v_ptr = V + v_off[:, None] + kvh * stride_vh + dv[None, :] * stride_vd
    if NVFP4:
        v = _fp4_rows(V + v_off[:, None] + kvh * stride_vh, VSf + vsf_off[:, None] + kvh * stride_vsh, n_ok, stride_vd,
                      0, HEAD_DV, BLOCK_DV, BLOCK_N, MASKED)
    elif MASKED:
        v = tl.load(v_ptr, mask=n_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    elif BLOCK_DV == HEAD_DV:
        v = tl.load(v_ptr)
    else:
        v = tl.load(v_ptr, mask=dv[None, :] < HEAD_DV, other=0.0)
    s = _qk(q, q2, K, k_off, kvh, stride_kh, stride_kd, start, n, n_ok, f_hi, f_lo, HEAD_DQK, BLOCK_DQK,
            BLOCK_HALF, BLOCK_N, ROPE, MASKED, DOT_F32, KSf, ksf_off, stride_ksh, NVFP4)
    # Plain logits: scale once per row max and fuse s*c - m into one FMA per element (the
    # softmax ALU work is what limits prefill). max(s) * c is the row max of s * c only for
    # c >= 0: _attn_fwd moves a negative scale's sign into q, so scale >= 0 here.
    PLAIN: tl.constexpr = not (HAS_ALIBI or SOFT_CAP)
    if PLAIN:
        c = scale * LOG2E
    else:
        c = 1.0
        s = _scores(s, n, t, scale, soft_cap, slope, HAS_ALIBI, SOFT_CAP)
    if MASKED:
        keep = _keep_mask(n, n_ok, t, row_ok, pos, b, q_start, q_len, kv_len, window_left,
                          mask_tile, SpecMask, stride_spec_b, stride_spec, spec_ragged,
                          CAUSAL, HAS_WINDOW, MASK_MODE, BLOCK_M, HPP, BLOCK_N)
        if PLAIN:  # scale before masking: (-inf) * 0 is NaN when sm_scale is 0
            s = s * c
            c = 1.0
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid (-inf) - (-inf)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s * c - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_F32:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:  # accumulate inside the MMA (no separate add of the whole tile)
        acc = tl.dot(p.to(q.dtype), _v_to_dot(v, q.dtype), acc)
    return m_new, l_i, acc


@triton.jit
def _f16_range(q, q2, ROPE: tl.constexpr):
    """(q * 2^s, q2 * 2^s, 2^-s) with the tile's largest |q| * 2^s in [2^13, 2^14): bf16 queries then
    convert to fp16 without overflow (fp16 tops at 65504) and keep their 8 significant bits; the
    power of two is exact and the caller folds 2^-s into the softmax scale."""
    amax = tl.max(tl.max(tl.abs(q), 1), 0)
    if ROPE:
        amax = tl.maximum(amax, tl.max(tl.max(tl.abs(q2), 1), 0))
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 |q|max) for normal numbers
    s = tl.minimum(13 - e, 126)  # all-zero or subnormal tiles: any scale is fine, stay in range
    mul = ((s + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return q * mul, q2 * mul, inv


@triton.jit
def _load_q(Q, RopeFreq, tok, h, row_ok, pos, stride_qt, stride_qh, stride_qd, HEAD_DQK: tl.constexpr,
            BLOCK_DQK: tl.constexpr, BLOCK_HALF: tl.constexpr, ROPE: tl.constexpr, DOT_F32: tl.constexpr,
            F16_DOTS: tl.constexpr):
    """The program's query tile in the dot's dtype: (q, q2, f_hi, f_lo, q_inv). ROPE: q and q2 are the
    rotated first and second halves at the rows' positions, f_hi/f_lo the frequencies (fp32 hi + lo);
    otherwise q is the whole row (q2 = q, the frequencies unused). Scores computed from q are
    q_inv times the true ones (a power of two, 1 unless bf16 queries were moved into fp16's range)."""
    base = Q + tok[:, None] * stride_qt + h[:, None] * stride_qh
    if ROPE:
        HALF: tl.constexpr = HEAD_DQK // 2
        dh = tl.arange(0, BLOCK_HALF)
        f_hi = tl.load(RopeFreq + dh)
        f_lo = tl.load(RopeFreq + BLOCK_HALF + dh)
        ok = row_ok[:, None] & (dh[None, :] < HALF)
        x1 = tl.load(base + dh[None, :] * stride_qd, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(base + (dh[None, :] + HALF) * stride_qd, mask=ok, other=0.0).to(tl.float32)
        c, sn = _rope_cos_sin(pos.to(tl.float32)[:, None], f_hi[None, :], f_lo[None, :])
        q = x1 * c - x2 * sn
        q2 = x2 * c + x1 * sn
    else:
        dk = tl.arange(0, BLOCK_DQK)
        q = tl.load(base + dk[None, :] * stride_qd, mask=row_ok[:, None] & (dk[None, :] < HEAD_DQK), other=0.0)
        q2 = q
        f_hi = 0.0
        f_lo = 0.0
    q_inv = 1.0
    if DOT_F32:
        q = q.to(tl.float32)
        q2 = q2.to(tl.float32)
    elif F16_DOTS:
        # fp8 K/V (or q; q_scale folded into sm_scale): e4m3/e5m2 -> fp16 is one cvt per two values
        # and exact, -> bf16 needs a second per value (the fp8 decode kernel was ALU bound on it).
        if Q.dtype.element_ty == tl.bfloat16 or ROPE:  # rotated fp16 q can leave fp16's range too
            q, q2, q_inv = _f16_range(q.to(tl.float32), q2.to(tl.float32), ROPE)
        q = q.to(tl.float16)
        q2 = q2.to(tl.float16)
    else:
        q = q.to(Q.dtype.element_ty)
        q2 = q2.to(Q.dtype.element_ty)
    return q, q2, f_hi, f_lo, q_inv


@triton.jit
def _logits_bounded(Q, K, KvIndptr, BlockTable, tok, h, row_ok, pos, b, kvh, scale, stride_qt, stride_qh,
                    stride_qd, stride_bt, stride_kp, stride_kt, stride_kh, stride_kd, HEAD_DQK: tl.constexpr,
                    BLOCK_DQK: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """True when every valid row r has |scale| * sum_d |q_rd| |k_d| <= FIXUP_LOGIT for the key at its
    own position (visible under causality and any window): then |logit| there is within the bound and
    the row max is at least -FIXUP_LOGIT. Rows without a key, NaN or inf bounds are not bounded."""
    dk = tl.arange(0, BLOCK_DQK)
    has_key = row_ok & (pos >= 0)
    key = tl.maximum(pos, 0)
    if PAGED:
        page = tl.load(BlockTable + b * stride_bt + key // PAGE_SIZE, mask=has_key, other=0).to(tl.int64)
        k_off = page * stride_kp + (key % PAGE_SIZE) * stride_kt
    else:
        k_off = (tl.load(KvIndptr + b) + key).to(tl.int64) * stride_kt
    ok = has_key[:, None] & (dk[None, :] < HEAD_DQK)
    q = tl.load(Q + tok[:, None] * stride_qt + h[:, None] * stride_qh + dk[None, :] * stride_qd, mask=ok,
                other=0.0).to(tl.float32)
    k = tl.load(K + k_off[:, None] + kvh * stride_kh + dk[None, :] * stride_kd, mask=ok, other=0.0).to(tl.float32)
    bound = tl.abs(scale) * tl.sum(tl.abs(q) * tl.abs(k), 1)
    unbounded = row_ok & ((pos < 0) | (bound > FIXUP_LOGIT) | (bound != bound))
    return tl.max(unbounded.to(tl.int32), 0) == 0


# Integers that change with the batch every step (its size, the block table's width, the split
# scratch's strides, the split count) are not specialized on (== 1, divisible by 16): a new value
# would otherwise compile a kernel variant on the request path.
@triton.jit(do_not_specialize=["kv_chunk", "stride_bt", "stride_ps", "stride_ls"])
def _attn_fwd(
    Q, K, V, Out, Lse, PartO, PartLse, SplitCount,
    QoIndptr, KvLens, KvIndptr, BlockTable, VBlockTable, Sinks, CustomMask, MaskIndptr, SpecMask, Alibi, RopeFreq,
    KSf, VSf, sm_scale, out_scale, soft_cap,
    window_left, kv_chunk, num_kv_heads,
    stride_qt, stride_qh, stride_qd,
    stride_kp, stride_kt, stride_kh, stride_kd,
    stride_vp, stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_lt, stride_lh, stride_bt, stride_spec_b, stride_spec, spec_ragged,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lst,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    GROUP: tl.constexpr, HPP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DQK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_HALF: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_SINKS: tl.constexpr, MASK_MODE: tl.constexpr,
    HAS_ALIBI: tl.constexpr, ROPE: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr,
    F16_DOTS: tl.constexpr, MERGE_BLOCK_S: tl.constexpr, FIXUP: tl.constexpr, NVFP4: tl.constexpr,
    V_TABLE: tl.constexpr,
    WRITE_LSE: tl.constexpr, SCALE_PTR: tl.constexpr, OUT_SCALE_PTR: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks see the most keys: launch them first to shorten the tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    HGROUPS: tl.constexpr = GROUP // HPP
    b = pid_bh // (num_kv_heads * HGROUPS)
    kvh = (pid_bh // HGROUPS) % num_kv_heads
    head0 = kvh * GROUP + (pid_bh % HGROUPS) * HPP

    q_start = tl.load(QoIndptr + b)
    q_len = tl.load(QoIndptr + b + 1) - q_start
    kv_len = tl.load(KvLens + b)
    t_first = (pid_m * BLOCK_M) // HPP
    if t_first >= q_len:  # the grid is sized by the longest request
        return
    t_last = tl.minimum(((pid_m + 1) * BLOCK_M - 1) // HPP, q_len - 1)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // HPP
    h = head0 + rows % HPP
    row_ok = t < q_len
    pos = kv_len - q_len + t  # bottom-right alignment
    tok = (q_start + t).to(tl.int64)

    # Keys this program visits: its split, cut by causality; under a window the splits start at the
    # tile of the program's first visible key.
    lo = pid_s * kv_chunk
    if HAS_WINDOW:
        first_visible = tl.maximum(kv_len - q_len + t_first - window_left, 0)
        lo += (first_visible // BLOCK_N) * BLOCK_N
    hi = tl.minimum(lo + kv_chunk, kv_len)
    if CAUSAL:
        hi = tl.minimum(hi, kv_len - q_len + t_last + 1)

    if SCALE_PTR:
        scale = tl.load(sm_scale).to(tl.float32)
    else:
        scale = sm_scale
    if FIXUP:
        if _logits_bounded(Q, K, KvIndptr, BlockTable, tok, h, row_ok, pos, b, kvh, scale, stride_qt, stride_qh,
                           stride_qd, stride_bt, stride_kp, stride_kt, stride_kh, stride_kd, HEAD_DQK, BLOCK_DQK,
                           PAGED, PAGE_SIZE):
            return  # the vendor's rows stand
    dv = tl.arange(0, BLOCK_DV)
    q, q2, f_hi, f_lo, q_inv = _load_q(Q, RopeFreq, tok, h, row_ok, pos, stride_qt, stride_qh, stride_qd,
                                       HEAD_DQK, BLOCK_DQK, BLOCK_HALF, ROPE, DOT_F32, F16_DOTS)
    scale = scale * q_inv
    # softmax(scale * q.k) with scale < 0 is softmax(|scale| * (-q).k): negating q is exact,
    # and the log2-domain tiles (row max of raw scores times the scale) need scale >= 0.
    q = tl.where(scale < 0, -q, q)
    if ROPE:
        q2 = tl.where(scale < 0, -q2, q2)
    scale = tl.abs(scale)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Alibi + h, mask=row_ok, other=0.0)

    kv_start = 0
    if not PAGED:
        kv_start = tl.load(KvIndptr + b)
    # Keys every valid row sees need no per-element mask: [lo_full, hi_full), whole tiles.
    lo_full = lo
    hi_full = hi
    if HAS_WINDOW:
        lo_full = tl.maximum(lo, (tl.maximum(kv_len - q_len + t_last - window_left, 0) + BLOCK_N - 1)
                             // BLOCK_N * BLOCK_N)
    if CAUSAL:
        hi_full = tl.minimum(hi, kv_len - q_len + t_first + 1)
    if MASK_MODE != 0:
        lo_full = hi
    lo_full = tl.minimum(lo_full, hi)
    hi_full = lo_full + tl.maximum(hi_full - lo_full, 0) // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    # A custom mask's tiles are loaded one iteration ahead (Triton 3.6 pipelines only the loads feeding
    # dots: the mask's was a synchronous load per tile). Only this loop runs under a mask (lo_full = hi
    # above): the other two pass no mask tile (MASKED=False, or empty).
    mask_tile = 0
    if MASK_MODE == 1:
        mask_tile = _custom_mask_tile(CustomMask, MaskIndptr, b, t, t_first, q_len, kv_len, lo, hi, BLOCK_M, HPP,
                                      BLOCK_N)
    for start in range(lo, lo_full, BLOCK_N):  # window edge (or everything under a custom mask)
        if MASK_MODE == 1:
            next_mask_tile = _custom_mask_tile(CustomMask, MaskIndptr, b, t, t_first, q_len, kv_len, start + BLOCK_N,
                                               hi, BLOCK_M, HPP, BLOCK_N)
        m_i, l_i, acc = _tile(
            q, q2, m_i, l_i, acc, start, hi, t, row_ok, pos, b, kvh, q_start, q_len, kv_len, kv_start,
            window_left, scale, soft_cap, slope, f_hi, f_lo, K, V, BlockTable, VBlockTable, stride_bt, stride_kp,
            stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, mask_tile, SpecMask,
            stride_spec_b, stride_spec, spec_ragged, KSf, VSf, stride_ksp, stride_kst, stride_ksh, stride_vsp,
            stride_vst, stride_vsh, BLOCK_N, HEAD_DQK, HEAD_DV, BLOCK_DQK, BLOCK_DV, BLOCK_HALF,
            PAGED, PAGE_SIZE, CAUSAL, HAS_WINDOW, SOFT_CAP, MASK_MODE, HAS_ALIBI, ROPE, DOT_F32, True,
            BLOCK_M, HPP, NVFP4, V_TABLE)
        if MASK_MODE == 1:
            mask_tile = next_mask_tile
    for start in range(lo_full, hi_full, BLOCK_N):  # interior: no mask arithmetic
        m_i, l_i, acc = _tile(
            q, q2, m_i, l_i, acc, start, hi, t, row_ok, pos, b, kvh, q_start, q_len, kv_len, kv_start,
            window_left, scale, soft_cap, slope, f_hi, f_lo, K, V, BlockTable, VBlockTable, stride_bt, stride_kp,
            stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, 0, SpecMask,
            stride_spec_b, stride_spec, spec_ragged, KSf, VSf, stride_ksp, stride_kst, stride_ksh, stride_vsp,
            stride_vst, stride_vsh, BLOCK_N, HEAD_DQK, HEAD_DV, BLOCK_DQK, BLOCK_DV, BLOCK_HALF,
            PAGED, PAGE_SIZE, CAUSAL, HAS_WINDOW, SOFT_CAP, MASK_MODE, HAS_ALIBI, ROPE, DOT_F32, False,
            BLOCK_M, HPP, NVFP4, V_TABLE)
    if MASK_MODE != 1:  # empty under a mask (lo_full = hi); without this guard it would see no mask tile
        for start in range(tl.maximum(hi_full, lo_full), hi, BLOCK_N):  # causal diagonal and the ragged end
            m_i, l_i, acc = _tile(
                q, q2, m_i, l_i, acc, start, hi, t, row_ok, pos, b, kvh, q_start, q_len, kv_len, kv_start,
                window_left, scale, soft_cap, slope, f_hi, f_lo, K, V, BlockTable, VBlockTable, stride_bt, stride_kp,
                stride_kt, stride_kh, stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, 0, SpecMask,
                stride_spec_b, stride_spec, spec_ragged, KSf, VSf, stride_ksp, stride_kst, stride_ksh, stride_vsp,
                stride_vst, stride_vsh, BLOCK_N, HEAD_DQK, HEAD_DV, BLOCK_DQK, BLOCK_DV, BLOCK_HALF,
                PAGED, PAGE_SIZE, CAUSAL, HAS_WINDOW, SOFT_CAP, MASK_MODE, HAS_ALIBI, ROPE, DOT_F32, True,
                BLOCK_M, HPP, NVFP4, V_TABLE)

    if SPLIT:
        # Normalized partial + its log2-sum-exp; empty splits give 0 / -inf.
        o_part = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse_part = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        prow = pid_s.to(tl.int64) * stride_ps + tok * stride_pt + h * stride_ph
        tl.store(PartO + prow[:, None] + dv[None, :], o_part, mask=row_ok[:, None] & (dv[None, :] < HEAD_DV))
        tl.store(PartLse + pid_s.to(tl.int64) * stride_ls + tok * stride_lst + h, lse_part, mask=row_ok)
        if MERGE_BLOCK_S > 0:
            _merge_if_last(PartO, PartLse, SplitCount, Out, Lse, Sinks, out_scale, pid_bh * tl.num_programs(0) + pid_m,
                           pid_m * BLOCK_M, head0, q_start, q_len, stride_ps, stride_pt, stride_ph, stride_ls,
                           stride_lst, stride_ot, stride_oh, stride_od, stride_lt, stride_lh, HPP, BLOCK_M,
                           HEAD_DV, BLOCK_DV, MERGE_BLOCK_S, HAS_SINKS, WRITE_LSE, OUT_SCALE_PTR)
    else:
        _finish_rows(acc, m_i, l_i, h, tok, row_ok, dv, Out, Lse, Sinks, out_scale,
                     stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
                     HEAD_DV, HAS_SINKS, WRITE_LSE, OUT_SCALE_PTR)


@triton.jit
def _finish_rows(acc, m_i, l_i, h, tok, row_ok, dv, Out, Lse, Sinks, out_scale,
                 stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
                 HEAD_DV: tl.constexpr, HAS_SINKS: tl.constexpr, WRITE_LSE: tl.constexpr,
                 OUT_SCALE_PTR: tl.constexpr):
    """Add the sink to the denominator, normalize, scale, store out (and LSE)."""
    any_key = m_i > float("-inf")
    if HAS_SINKS:
        sink2 = tl.load(Sinks + h, mask=row_ok, other=0.0) * LOG2E
        m_fin = tl.maximum(m_i, sink2)
        rescale = tl.exp2(m_i - m_fin)
        l_i = l_i * rescale + tl.exp2(sink2 - m_fin)
        acc = acc * rescale[:, None]
        m_i = m_fin
    if WRITE_LSE:  # log2 of the whole denominator, the sink's term included (backends/native/reference.py)
        has_sum = m_i > float("-inf")
        lse = tl.where(has_sum, m_i + tl.log2(tl.where(has_sum, l_i, 1.0)), float("-inf"))
        tl.store(Lse + tok * stride_lt + h * stride_lh, lse, mask=row_ok)
    if OUT_SCALE_PTR:
        o_scale = tl.load(out_scale).to(tl.float32)
    else:
        o_scale = out_scale
    out = acc * (o_scale / tl.where(any_key, l_i, 1.0))[:, None]
    out = tl.where(any_key[:, None], out, 0.0)  # fully masked rows: 0
    tl.store(Out + tok[:, None] * stride_ot + h[:, None] * stride_oh + dv[None, :] * stride_od,
             _out_values(out, Out), mask=row_ok[:, None] & (dv[None, :] < HEAD_DV))


@triton.jit
def _merge_if_last(PartO, PartLse, SplitCount, Out, Lse, Sinks, out_scale, group, row0, head0, q_start, q_len,
                   stride_ps, stride_pt, stride_ph, stride_ls, stride_lst,
                   stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
                   HPP: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr, WRITE_LSE: tl.constexpr,
                   OUT_SCALE_PTR: tl.constexpr):
    """The split merge in the same launch: the last of a row block's split programs to finish merges
    its rows. Why try: a second launch costs a decode call its launch and the gap between the kernels,
    much of a short one (H100 1 x 512: 12.5 us against fa2's 8.0). Measured no faster on the H100, so
    off by default (triton_backend.MAX_FUSED_MERGE_SPLITS).

    Ordering: the barrier puts every thread's partial stores before the counter's acq_rel atomic (one
    thread's, cumulative over what the barrier ordered), so the program that sees ``splits - 1`` reads
    every split's partials; it reads them from L2 (.cg: another SM wrote them). It then sets the
    counter back to 0, so every launch (a CUDA-graph replay too) starts from the plan's zeros.
    The merge is on the call's critical path, so it has no dependent chain per split: all rows at
    once, the splits' loads unrolled (independent, in flight together), one reduction at the end."""
    tl.debug_barrier()
    arrived = tl.atomic_add(SplitCount + group, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(2) - 1:
        rows = row0 + tl.arange(0, BLOCK_M)
        t = rows // HPP
        h = head0 + rows % HPP
        tok = (q_start + t).to(tl.int64)
        dv = tl.arange(0, BLOCK_DV)
        splits = tl.num_programs(2)
        sp = tl.arange(0, BLOCK_S)
        lse_row = PartLse + tok * stride_lst + h
        split_rows = tl.where(sp < splits, q_len, 0)  # masks of "t < q_len and s < splits" (interpreter-safe)
        lse = tl.load(lse_row[:, None] + sp[None, :] * stride_ls, mask=t[:, None] < split_rows[None, :],
                      other=float("-inf"), cache_modifier=".cg")
        m = tl.max(lse, 1)
        m_safe = tl.where(m > float("-inf"), m, 0.0)
        denom = tl.sum(tl.exp2(lse - m_safe[:, None]), 1)
        o_row = PartO + tok * stride_pt + h * stride_ph
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for s in tl.static_range(BLOCK_S):
            ok = t < tl.where(s < splits, q_len, 0)
            w = tl.exp2(tl.load(lse_row + s * stride_ls, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_safe)
            part = tl.load(o_row[:, None] + s * stride_ps + dv[None, :], mask=ok[:, None] & (dv[None, :] < HEAD_DV),
                           other=0.0, cache_modifier=".cg")
            acc += part * w[:, None]
        _finish_rows(acc, m, denom, h, tok, t < q_len, dv, Out, Lse, Sinks, out_scale,
                     stride_ot, stride_oh, stride_od, stride_lt, stride_lh, HEAD_DV, HAS_SINKS, WRITE_LSE,
                     OUT_SCALE_PTR)
        tl.store(SplitCount + group, 0)


@triton.jit(do_not_specialize=["num_splits", "stride_ps", "stride_ls"])  # see _attn_fwd
def _merge_splits(
    PartO, PartLse, Out, Lse, Sinks, out_scale, num_splits,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lst,
    stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
    HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr, OUT_SCALE_PTR: tl.constexpr,
):
    """One program per (token, head): softmax-weighted sum of the split partials."""
    tok = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    s_ok = sp < num_splits
    lse = tl.load(PartLse + sp * stride_ls + tok * stride_lst + h, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    any_key = m > float("-inf")
    m_safe = tl.where(any_key, m, 0.0)
    w = tl.exp2(lse - m_safe)
    keys_sum = tl.sum(w, 0)
    denom = keys_sum
    if HAS_SINKS:  # counted once, here; exp2 may overflow only if the sink exceeds the keys by >127
        denom += tl.exp2(tl.load(Sinks + h) * LOG2E - m_safe)
    parts = tl.load(PartO + sp[:, None] * stride_ps + tok * stride_pt + h * stride_ph + dv[None, :],
                    mask=s_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    if OUT_SCALE_PTR:
        o_scale = tl.load(out_scale).to(tl.float32)
    else:
        o_scale = out_scale
    denom_safe = tl.where(any_key, denom, 1.0)
    out = tl.sum(parts * w[:, None], 0) * (o_scale / denom_safe)
    out = tl.where(any_key, out, 0.0)
    tl.store(Out + tok * stride_ot + h * stride_oh + dv * stride_od, _out_values(out, Out),
             mask=dv < HEAD_DV)
    if WRITE_LSE:  # the whole denominator's, the sink's term included
        has_sum = denom > 0
        tl.store(Lse + tok * stride_lt + h * stride_lh,
                 tl.where(has_sum, m_safe + tl.log2(tl.where(has_sum, denom, 1.0)), float("-inf")))
