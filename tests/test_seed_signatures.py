"""Every seed entry point, class and method keeps the signature its seed page shows.

The seed parameters are parsed from tests/seed_docs/*.txt (tests/_seed_text.py), not copied:
name, order, kind (positional-or-keyword / keyword-only) and default of each must match
``inspect.signature`` of dispatch's object, and every parameter after them must be keyword-only
(newer FlashInfer spellings, appended). The newer spellings listed here are the project's
signature contract (the seed pages do not show them); an alias of a seed parameter must work
alone and give a TypeError naming both spellings when both are given.

The 002 page lists ``single_prefill_with_kv_cache()`` without parameters; the 004 page gives the
full list and says it is the same function returning the LSE. So single_prefill_with_kv_cache's
seed parameters are 004's with ``return_lse`` positional, default False (FlashInfer defines the
_return_lse function as ``partial(single_prefill_with_kv_cache, return_lse=True)``).
"""
from __future__ import annotations

import inspect

import pytest
import torch

import dispatch
from _seed_text import REQUIRED, seed_signatures
from oracle import attention_fp64

SEED = seed_signatures()
PAGED, RAGGED = dispatch.BatchPrefillWithPagedKVCacheWrapper, dispatch.BatchPrefillWithRaggedKVCacheWrapper
_PLAN_NEW = dict(head_dim_qk=None, head_dim_vo=None, use_fp16_qk_reduction=None, o_data_type=None,
                 prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
                 max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None,
                 max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False)
_SINGLE_NEW = dict(use_fp16_qk_reduction=None, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                   backend="auto", kv_cache_sf=None, k_scale=None, v_scale=None)
_INIT_NEW = dict(mask_indptr_buf=None, jit_args=None, jit_kwargs=None, variant_owns_mask=False)
# target -> (dispatch object, seed parameters, newer keyword-only parameters with their defaults)
TARGETS = {
    "cudnn": (dispatch.cudnn_batch_prefill_with_kv_cache, SEED["cudnn"],
              dict(q_scale=None, k_scale=None, v_scale=None, batch_offsets_units="elements", o_data_type=None,
                   lse_base="log2")),
    "trtllm": (dispatch.trtllm_batch_context_with_kv_cache, SEED["trtllm"],
               dict(kv_cache_sf=None, causal=True, lse=None, return_lse=False, multi_ctas_kv_counter_buffer=None,
                    use_fp16_softmax=None, uses_spcompress=None, backend="auto")),
    "xqa": (dispatch.xqa_batch_decode_with_kv_cache, SEED["xqa"], dict(q_cu_seq_lens=None)),
    "single": (dispatch.single_prefill_with_kv_cache,
               [p if p[0] != "return_lse" else ("return_lse", "P", False) for p in SEED["single_return_lse"]],
               _SINGLE_NEW),
    "single_return_lse": (dispatch.single_prefill_with_kv_cache_return_lse, SEED["single_return_lse"],
                          {k: v for k, v in _SINGLE_NEW.items() if k != "return_lse"}),
    "paged.__init__": (PAGED.__init__, SEED["paged.__init__"], _INIT_NEW),
    "paged.class": (PAGED, SEED["paged.class"], _INIT_NEW),
    "paged.plan": (PAGED.plan, SEED["paged.plan"], dict(_PLAN_NEW, block_tables=None)),
    "paged.run": (PAGED.run, SEED["paged.run"],
                  dict(q_scale=None, out=None, lse=None, enable_pdl=None, window_left=None, sinks=None,
                       kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None,
                       uses_spcompress=None, lse_base="log2", lse_layout="NH")),
    "paged.reset_workspace_buffer": (PAGED.reset_workspace_buffer, SEED["paged.reset_workspace_buffer"], {}),
    "ragged.__init__": (RAGGED.__init__, SEED["ragged.__init__"], _INIT_NEW),
    "ragged.class": (RAGGED, SEED["ragged.class"], _INIT_NEW),
    "ragged.plan": (RAGGED.plan, SEED["ragged.plan"], dict(_PLAN_NEW, non_blocking=True, v_indptr=None, o_indptr=None)),
    "ragged.run": (RAGGED.run, SEED["ragged.run"],
                   dict(q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None, enable_pdl=None,
                        kv_cache_sf=None, lse_base="log2", lse_layout="NH")),
    "ragged.reset_workspace_buffer": (RAGGED.reset_workspace_buffer, SEED["ragged.reset_workspace_buffer"], {}),
}
KIND = {"P": inspect.Parameter.POSITIONAL_OR_KEYWORD, "K": inspect.Parameter.KEYWORD_ONLY}


def actual_params(obj) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    return params[1:] if params and params[0].name == "self" else params


def test_seed_pages_parsed():
    """The parser found every seed signature (a regression here hides every other check)."""
    assert len(SEED["trtllm"]) == 23 and len(SEED["cudnn"]) == 21 and len(SEED["xqa"]) == 17
    assert len(SEED["paged.plan"]) == 21 and len(SEED["ragged.plan"]) == 17
    assert SEED["paged.class"] == SEED["paged.__init__"] and SEED["ragged.class"] == SEED["ragged.__init__"]


@pytest.mark.parametrize("target", list(TARGETS))
def test_seed_parameters(target):
    obj, seed, _ = TARGETS[target]
    got = [(p.name, p.kind, p.default) for p in actual_params(obj)][: len(seed)]
    want = [(name, KIND[kind], default) for name, kind, default in seed]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{target} parameter #{i}: got {g}, the seed shows {w}"
    assert len(got) == len(want), f"{target}: {len(got)} parameters, the seed shows {len(want)}"


@pytest.mark.parametrize("target", list(TARGETS))
def test_newer_parameters_keyword_only(target):
    obj, seed, newer = TARGETS[target]
    tail = actual_params(obj)[len(seed):]
    positional = [p.name for p in tail if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not positional, f"{target}: parameters after the seed's must be keyword-only: {positional}"
    defaults = {p.name: p.default for p in tail}
    missing = sorted(set(newer) - set(defaults))
    assert not missing, f"{target}: newer FlashInfer keywords missing: {missing}"
    wrong = {n: (defaults[n], d) for n, d in newer.items() if defaults[n] != d}
    assert not wrong, f"{target}: defaults (got, contract): {wrong}"


FORWARD_PAGED = [("q", REQUIRED), ("paged_kv_cache", REQUIRED), ("causal", False), ("pos_encoding_mode", "NONE"),
                 ("use_fp16_qk_reduction", False), ("k_scale", None), ("v_scale", None), ("window_left", -1),
                 ("logits_soft_cap", None), ("sm_scale", None), ("rope_scale", None), ("rope_theta", None)]
FORWARD_RAGGED = [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("causal", False), ("pos_encoding_mode", "NONE"),
                  ("use_fp16_qk_reduction", False), ("window_left", -1), ("logits_soft_cap", None),
                  ("sm_scale", None), ("rope_scale", None), ("rope_theta", None)]


@pytest.mark.parametrize("cls, method, expected", [
    (PAGED, "forward", FORWARD_PAGED), (PAGED, "forward_return_lse", FORWARD_PAGED),
    (RAGGED, "forward", FORWARD_RAGGED), (RAGGED, "forward_return_lse", FORWARD_RAGGED),
], ids=["paged.forward", "paged.forward_return_lse", "ragged.forward", "ragged.forward_return_lse"])
def test_deprecated_forward(cls, method, expected):
    got = [(p.name, p.default) for p in actual_params(getattr(cls, method))]
    assert got == expected
    kinds = {p.kind for p in actual_params(getattr(cls, method))}
    assert kinds == {inspect.Parameter.POSITIONAL_OR_KEYWORD}


@pytest.mark.parametrize("cls", [PAGED, RAGGED], ids=["paged", "ragged"])
def test_begin_forward_is_plan_and_end_forward_is_a_noop(cls):
    assert inspect.signature(cls.begin_forward) == inspect.signature(cls.plan)
    assert [p.name for p in actual_params(cls.end_forward)] == []
    assert [p.name for p in actual_params(cls.run_return_lse)][:2] == [p.name for p in actual_params(cls.run)][:2]


# -- aliases: work alone, TypeError naming both spellings when both are given ---------------------
def _single_inputs():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, h, 16, generator=g) for n, h in ((5, 4), (9, 2), (9, 2))]


def _ws():
    return torch.empty(1 << 16, dtype=torch.uint8)


def _ragged_plan_args():
    return (torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 6, 9], dtype=torch.int32), 4, 2)


def _paged_plan_args():
    return (torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32),
            torch.tensor([2, 0, 1], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32), 4, 2)


def _call_single(fn, **kw):
    q, k, v = _single_inputs()
    return fn(q, k, v, causal=True, **kw)


def _call_ctor(cls, **kw):
    return cls(_ws(), "NHD", **kw)


def _call_ragged_plan(**kw):
    w = RAGGED(_ws(), "NHD")
    w.plan(*_ragged_plan_args(), causal=True, q_data_type=torch.float32, **kw)
    return w


def _call_paged_plan(**kw):
    w = PAGED(_ws(), "NHD")
    kw.setdefault("page_size", 4)
    w.plan(*_paged_plan_args(), causal=True, q_data_type=torch.float32, **kw)
    return w


def _buf():
    return torch.zeros(3, dtype=torch.int32)


ALIASES = [  # (id, call, seed spelling, value, newer spelling, value)
    ("single-fp16_qk", lambda **kw: _call_single(dispatch.single_prefill_with_kv_cache, **kw),
     "allow_fp16_qk_reduction", True, "use_fp16_qk_reduction", True),
    ("single_return_lse-fp16_qk", lambda **kw: _call_single(dispatch.single_prefill_with_kv_cache_return_lse, **kw),
     "allow_fp16_qk_reduction", False, "use_fp16_qk_reduction", False),
    ("paged-init-mask_indptr", lambda **kw: _call_ctor(PAGED, **kw), "qk_indptr_buf", _buf(), "mask_indptr_buf", _buf()),
    ("ragged-init-mask_indptr", lambda **kw: _call_ctor(RAGGED, **kw), "qk_indptr_buf", _buf(), "mask_indptr_buf",
     _buf()),
    ("paged-plan-head_dim", _call_paged_plan, "head_dim", 16, "head_dim_qk", 16),
    ("ragged-plan-head_dim", _call_ragged_plan, "head_dim", 16, "head_dim_qk", 16),
    ("paged-plan-fp16_qk", lambda **kw: _call_paged_plan(head_dim=16, **kw), "allow_fp16_qk_reduction", True,
     "use_fp16_qk_reduction", True),
    ("ragged-plan-fp16_qk", lambda **kw: _call_ragged_plan(head_dim=16, **kw), "allow_fp16_qk_reduction", True,
     "use_fp16_qk_reduction", True),
]


@pytest.mark.parametrize("call, old, old_value, new, new_value", [a[1:] for a in ALIASES],
                         ids=[a[0] for a in ALIASES])
def test_alias_alone_and_both(call, old, old_value, new, new_value):
    first, second = call(**{old: old_value}), call(**{new: new_value})
    if isinstance(first, torch.Tensor) or isinstance(first, tuple):
        a, b = (first[0], second[0]) if isinstance(first, tuple) else (first, second)
        assert torch.equal(a, b), f"{new}= gives another result than {old}="
    with pytest.raises(TypeError) as info:
        call(**{old: old_value, new: new_value})
    assert old in str(info.value) and new in str(info.value), str(info.value)


def test_alias_results_are_right():
    """single with use_fp16_qk_reduction= (newer spelling) agrees with the fp64 oracle."""
    q, k, v = _single_inputs()
    out = dispatch.single_prefill_with_kv_cache(q, k, v, causal=True, use_fp16_qk_reduction=True)
    ref, _ = attention_fp64(q, k, v, sm_scale=16 ** -0.5, causal=True)
    assert (out.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("old, new", [("kv_block_scales", "kv_cache_sf")])
def test_trtllm_kv_cache_sf_alias(old, new):
    """Both spellings are accepted alone (None); both given (even as None) is a TypeError."""
    from _calls import make
    for kw in ({old: None}, {new: None}):
        call = make("trtllm", seed=3)
        call.kw.update(kw)
        call.check(call.invoke())
    call = make("trtllm", seed=3)
    call.kw.update({old: None, new: None})
    with pytest.raises(TypeError) as info:
        call.invoke()
    assert old in str(info.value) and new in str(info.value), str(info.value)
