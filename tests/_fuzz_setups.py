"""Random VALID scenario Setups per entry point (tests/scenarios.py renders them), and siblings.

``random_setup(entry, rng)`` draws only combinations the entry's calling convention allows
(FlashInfer's documented signatures: trtllm has no soft cap / custom mask and no
window without causal, xqa is decode or spec-decode without LSE, ...). ``sibling(setup, rng)``
keeps the shapes but changes one cache-relevant fact: a head count, a head dim, the KV lengths
or the layout.
"""
from __future__ import annotations

import random
from dataclasses import replace

from scenarios import Setup

HEADS = [(1, 1), (2, 1), (4, 2), (4, 4), (8, 2), (6, 3)]
HALF = ("fp16", "bf16")
FP32_OK = ("paged", "ragged", "single", "single_lse")


def _lens(rng: random.Random, batch: int, causal_ok_q_gt_kv: bool) -> tuple[list, list]:
    q = [rng.randint(1, 6) for _ in range(batch)]
    kv = [rng.randint(1, 20) for _ in range(batch)]
    if not causal_ok_q_gt_kv:
        kv = [max(a, b) for a, b in zip(q, kv)]
    return q, kv


def dtype_for(entry: str, rng: random.Random) -> str:
    return rng.choice(HALF + (("fp32",) if entry in FP32_OK else ()))


def random_setup(entry: str, rng: random.Random, dtype: str) -> Setup:
    hq, hkv = rng.choice(HEADS)
    batch = 1 if entry.startswith("single") else rng.randint(1, 4)
    s = Setup(q_lens=[1], kv_lens=[1], hq=hq, hkv=hkv, dqk=rng.choice([16, 32]),
              causal=rng.random() < 0.7, page_size=rng.choice([1, 3, 4, 8]), want_lse=rng.random() < 0.5,
              provide_out=rng.random() < 0.7, permute_pages=rng.random() < 0.5, strided=rng.random() < 0.2,
              sm_scale=rng.choice([None, None, 0.3]))
    s.q_lens, s.kv_lens = _lens(rng, batch, entry != "trtllm")
    return _entry_features(entry, s, rng, dtype)


def _entry_features(entry: str, s: Setup, rng, dtype: str) -> Setup:
    return {"cudnn": _cudnn, "trtllm": _trtllm, "xqa": _xqa, "paged": _paged, "ragged": _ragged,
            "single": _single, "single_lse": _single}[entry](s, rng, dtype)


def _modifiers(s: Setup, rng, soft_cap=True, rope=True, mask=True):
    if rng.random() < 0.3:
        s.window_left = rng.randint(0, 6)
    if soft_cap and rng.random() < 0.2:
        s.soft_cap = rng.choice([1.5, 5.0])
    if rope and rng.random() < 0.15:
        s.pos_encoding = "ROPE_LLAMA"
    if mask and rng.random() < 0.2:
        s.causal = False
        packable = all(a * b % 8 == 0 for a, b in zip(s.q_lens, s.kv_lens))
        s.mask = "custom_packed" if packable and rng.random() < 0.5 else "custom"
    if rng.random() < 0.2:
        s.scale_mode = "scales"
    return s


def _cudnn(s: Setup, rng, dtype):
    s.variant = rng.choice(["", "", "token_offsets", "lens_1d", "ragged"])
    s.layout = rng.choice([None, "NHD", "HND"])
    if s.variant == "ragged" and rng.random() < 0.3:
        s.dvo = 16
    return s


def _trtllm(s: Setup, rng, dtype):
    _modifiers(s, rng, soft_cap=False, rope=False, mask=False)
    if not s.causal:
        s.window_left = -1  # trtllm-gen: a window needs causal
    s.layout, s.cache_form = rng.choice([None, "NHD", "HND"]), rng.choice(["5d", "tuple"])
    s.sinks = rng.random() < 0.2
    s.fp8_kv = dtype != "fp32" and rng.random() < 0.1
    if rng.random() < 0.1:
        s.scale_mode = "tensors"
    if s.want_lse and rng.random() < 0.2:
        s.variant = "lse_buffer_only"
    elif rng.random() < 0.1:
        s.variant = "cum_kv_garbage"
    return s


def _xqa(s: Setup, rng, dtype):
    _modifiers(s, rng, soft_cap=False, rope=False, mask=False)
    s.causal, s.want_lse, s.strided = True, False, False
    s.layout, s.cache_form = rng.choice([None, "NHD", "HND"]), rng.choice(["5d", "tuple"])
    s.sinks = rng.random() < 0.2
    s.fp8_kv = rng.random() < 0.1
    if rng.random() < 0.3:
        width = rng.randint(2, 4)
        s.mask = rng.choice(["spec_causal", "spec_random"])
        if rng.random() < 0.3:
            s.variant, s.q_lens = "q_cu", [rng.randint(0, width) for _ in s.kv_lens]
            s.q_lens[0] = width
        else:
            s.q_lens = [width] * len(s.kv_lens)
        s.kv_lens = [max(k, width) for k in s.kv_lens]
    else:
        s.q_lens = [1] * len(s.kv_lens)
    return s


def _paged(s: Setup, rng, dtype):
    _modifiers(s, rng)
    s.layout = rng.choice([None, "NHD", "HND"])
    s.cache_form = rng.choice(["5d", "tuple"] + (["squeezed", "squeezed_tuple"] if s.page_size == 1 else []))
    if s.cache_form.startswith("squeezed"):
        s.strided = False
    s.sinks = rng.random() < 0.15
    s.fp8_kv = dtype != "fp32" and rng.random() < 0.1
    return s


def _ragged(s: Setup, rng, dtype):
    _modifiers(s, rng)
    if s.strided:
        s.kv_lens = list(s.q_lens)
    if rng.random() < 0.2 and s.dqk >= 32:
        s.dvo = s.dqk // 2  # >= 16: native-triton declares head dims in [16, 256]
    return s


def _single(s: Setup, rng, dtype):
    _modifiers(s, rng)
    s.layout = rng.choice([None, "NHD", "HND"])
    return s


def sibling(entry: str, s: Setup, rng) -> Setup:
    """The same call shapes but one other fact (heads, head dim, kv lengths, layout)."""
    choices = ["kv_lens", "hkv", "dqk"]
    if entry in ("paged", "trtllm", "xqa", "single", "single_lse") or (entry == "cudnn" and s.variant != "ragged"):
        choices.append("layout")
    what = rng.choice(choices)
    if what == "kv_lens":
        grow = [k + rng.randint(1, 9) for k in s.kv_lens]
        return replace(s, kv_lens=grow, q_lens=list(grow) if entry == "ragged" and s.strided else s.q_lens)
    if what == "hkv":
        options = [h for h in (1, 2, 3, 4, 6, 8) if s.hq % h == 0 and h != s.hkv] or [s.hkv]
        return replace(s, hkv=rng.choice(options))
    if what == "dqk":
        return replace(s, dqk=48 if s.dqk != 48 else 16, dvo=None)
    flip = {"NHD": "HND", "HND": "NHD", None: "HND"}
    return replace(s, layout=flip[s.layout])
