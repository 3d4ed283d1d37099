"""Hand-checkable cases proving the fp64 oracle itself (tests/oracle.py)."""
from __future__ import annotations

import math

import pytest
import torch

from oracle import (allowed_keys, attention_fp64, pack_spec_bits, packbits_little, query_positions,
                    rope_llama, spec_decode_mask)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_one_key_gives_v_and_lse_is_score_over_ln2():
    q, k, v = _randn(1, 2, 8, seed=1), _randn(1, 2, 8, seed=2), _randn(1, 2, 8, seed=3)
    out, lse = attention_fp64(q, k, v, sm_scale=0.3)
    torch.testing.assert_close(out, v, rtol=0, atol=1e-15)
    score = (q * k).sum(-1) * 0.3
    torch.testing.assert_close(lse, score / math.log(2), rtol=1e-14, atol=0)


def test_uniform_scores_give_mean_of_v_and_lse_log2_n():
    n = 6
    q = torch.zeros(1, 1, 4, dtype=torch.float64)  # q . k = 0 for every key
    k, v = _randn(n, 1, 4, seed=4), _randn(n, 1, 4, seed=5)
    out, lse = attention_fp64(q, k, v, sm_scale=1.0)
    torch.testing.assert_close(out[0, 0], v[:, 0].mean(0), rtol=0, atol=1e-15)
    assert lse.item() == pytest.approx(math.log2(n), abs=1e-14)


def test_sink_adds_exp_sink_to_the_denominator_only():
    q = torch.zeros(1, 2, 4, dtype=torch.float64)
    k, v = _randn(3, 1, 4, seed=6), _randn(3, 1, 4, seed=7)
    sinks = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
    out, lse = attention_fp64(q, k, v, sm_scale=1.0, sinks=sinks)
    # head 0: 3 keys of weight 1 + sink exp(0)=1 -> mean * 3/4; head 1: sink weight 3 -> mean * 3/6
    mean = v[:, 0].mean(0)
    torch.testing.assert_close(out[0, 0], mean * 0.75, rtol=0, atol=1e-15)
    torch.testing.assert_close(out[0, 1], mean * 0.5, rtol=0, atol=1e-15)
    # the LSE is the whole denominator's (FlashInfer's sink variants, trtllm-gen, cuDNN): log2(3 + 1), log2(3 + 3)
    torch.testing.assert_close(lse[0], torch.tensor([2.0, math.log2(6.0)], dtype=torch.float64))


def test_sink_on_a_fully_masked_row_gives_zero_and_the_sinks_lse():
    q, k, v = _randn(3, 1, 4, seed=21), _randn(1, 1, 4, seed=22), _randn(1, 1, 4, seed=23)
    out, lse = attention_fp64(q, k, v, sm_scale=1.0, causal=True, sinks=torch.tensor([1.0]))
    assert torch.all(out[:2] == 0) and torch.allclose(lse[:2], torch.full((2, 1), 1.0 / math.log(2.0), dtype=torch.float64))
    assert torch.all(out[2].abs() > 0)  # the last row sees its key, damped by the sink
    _, bare = attention_fp64(q, k, v, sm_scale=1.0, causal=True)
    assert torch.all(torch.isneginf(bare[:2]))  # without a sink: -inf


def test_lse_with_sinks_is_the_log_of_the_whole_denominator():
    # random inputs: out must equal sum_k exp(s_k - lse) v_k with the LSE the oracle returns (natural log)
    q, k, v = _randn(5, 4, 8, seed=31), _randn(9, 2, 8, seed=32), _randn(9, 2, 8, seed=33)
    sinks = _randn(4, seed=34) * 3
    out, lse = attention_fp64(q, k, v, sm_scale=0.4, causal=True, sinks=sinks)
    s = torch.einsum("lhd,shd->hls", q, k.repeat_interleave(2, 1)) * 0.4
    s = s.masked_fill(~allowed_keys(5, 9, True)[None], -math.inf)
    weights = torch.exp(s - (lse.t() * math.log(2.0))[..., None])
    torch.testing.assert_close(out, torch.einsum("hls,shd->lhd", weights, v.repeat_interleave(2, 1)))
    torch.testing.assert_close(torch.exp2(lse.t()), torch.exp(s).sum(-1) + torch.exp(sinks)[:, None])


def test_positions_are_bottom_right_aligned():
    assert query_positions(3, 10).tolist() == [7, 8, 9]
    keep = allowed_keys(2, 4, causal=True)
    assert keep.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("window_left", [0, 2, 5, 50])
def test_window_counts_window_left_plus_one_keys(window_left):
    q_len, kv_len = 4, 9
    keep = allowed_keys(q_len, kv_len, causal=True, window_left=window_left)
    pos = query_positions(q_len, kv_len)
    expected = [min(window_left + 1, int(p) + 1) for p in pos]
    assert keep.sum(-1).tolist() == expected
    assert all(keep[i, int(pos[i])] for i in range(q_len))  # own key always inside the window


def test_window_without_causal_keeps_only_the_lower_bound():
    keep = allowed_keys(2, 6, causal=False, window_left=1)  # positions 4, 5
    assert keep.tolist() == [[False, False, False, True, True, True], [False, False, False, False, True, True]]


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = _randn(5, 2, 4, seed=8), _randn(2, 1, 4, seed=9), _randn(2, 1, 4, seed=10)
    out, lse = attention_fp64(q, k, v, sm_scale=0.5, causal=True)  # positions -3..1
    assert torch.all(out[:3] == 0) and torch.all(torch.isneginf(lse[:3]))
    torch.testing.assert_close(out[3], v[0].expand(2, 4))  # position 0 sees key 0 only
    assert torch.all(torch.isfinite(lse[3:]))


def test_soft_cap_applies_after_scaling():
    q, k, v = _randn(1, 1, 4, seed=11), _randn(1, 1, 4, seed=12), _randn(1, 1, 4, seed=13)
    _, lse = attention_fp64(q, k, v, sm_scale=2.0, soft_cap=0.5)
    s = 2.0 * (q * k).sum()
    assert lse.item() == pytest.approx(0.5 * math.tanh(s / 0.5) / math.log(2), abs=1e-14)


def test_alibi_origin_moves_only_the_lse_without_a_soft_cap_and_the_output_with_one():
    """The bias is slope * (key - query row) (FlashInfer FA2) or slope * (key - query position): a constant
    shift per row, slope * (kv_len - q_len), that the softmax ignores but the soft cap, applied to the
    biased logits, does not."""
    q, k, v = _randn(3, 2, 8, seed=11), _randn(7, 2, 8, seed=12), _randn(7, 2, 8, seed=13)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)
    shift = slopes * (7 - 3) / math.log(2)  # base 2

    def run(origin, cap):
        return attention_fp64(q, k, v, sm_scale=0.4, causal=True, soft_cap=cap, alibi_slopes=slopes,
                              alibi_query=origin)
    (out_row, lse_row), (out_pos, lse_pos) = run("row", 0.0), run("position", 0.0)
    torch.testing.assert_close(out_row, out_pos, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(lse_row - shift, lse_pos, rtol=1e-13, atol=1e-13)
    (out_row, _), (out_pos, _) = run("row", 1.5), run("position", 1.5)
    assert (out_row - out_pos).abs().max() > 1e-3
    # the cap applies to the biased logits: one key, cap * tanh((sm_scale * q.k + slope * (0 - 0)) / cap)
    one, lse = attention_fp64(q[:1], k[:1], v[:1], sm_scale=0.4, soft_cap=1.5, alibi_slopes=slopes,
                              alibi_query="position")
    logit = 1.5 * torch.tanh((q[0] * k[0]).sum(-1) * 0.4 / 1.5)
    torch.testing.assert_close(lse[0], logit / math.log(2), rtol=1e-14, atol=0)


def test_gqa_head_h_reads_kv_head_h_over_group():
    q = torch.zeros(1, 4, 2, dtype=torch.float64)
    k = _randn(1, 2, 2, seed=14)
    v = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]], dtype=torch.float64)  # kv heads 0 and 1
    out, _ = attention_fp64(q, k, v, sm_scale=1.0)
    assert out[0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


def test_scales_multiply_logits_and_output():
    q, k, v = _randn(3, 2, 8, seed=15), _randn(5, 2, 8, seed=16), _randn(5, 2, 8, seed=17)
    ref, _ = attention_fp64(q * 0.2, k, v, sm_scale=1.0)
    f64 = torch.float64
    out, _ = attention_fp64(q, k, v, sm_scale=torch.tensor(0.2, dtype=f64), out_scale=torch.tensor([0.7], dtype=f64))
    torch.testing.assert_close(out, ref * 0.7, rtol=1e-13, atol=1e-15)


def test_rope_rotates_pairs_first_half_with_second_half():
    x = torch.zeros(1, 1, 4, dtype=torch.float64)
    x[0, 0, 0] = 1.0  # pair (0, 2) has frequency theta^0 = 1
    out = rope_llama(x, torch.tensor([1]), rope_scale=1.0, rope_theta=1e4)
    torch.testing.assert_close(out[0, 0], torch.tensor([math.cos(1), 0.0, math.sin(1), 0.0], dtype=torch.float64))
    # relative positions only: shifting q and k positions together leaves q.k unchanged
    q, k = _randn(1, 1, 8, seed=18), _randn(1, 1, 8, seed=19)
    dot = [(rope_llama(q, torch.tensor([3 + t]), 2.0, 100.0) * rope_llama(k, torch.tensor([1 + t]), 2.0, 100.0)).sum()
           for t in (0, 7)]
    assert dot[0].item() == pytest.approx(dot[1].item(), abs=1e-12)
    assert dot[0].item() != pytest.approx((q * k).sum().item(), abs=1e-6)


def test_spec_decode_mask_keeps_the_prefix_visible():
    draft = torch.tensor([[True, False], [True, True]])
    full = spec_decode_mask(draft, kv_len=5)
    assert full.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_spec_bits_are_little_endian_uint32_words_as_uint16_pairs():
    row = torch.zeros(1, 40, dtype=torch.bool)
    row[0, [0, 1, 17, 33]] = True  # word0 = 1 + 2 + 2**17, word1 = 2**1
    packed = pack_spec_bits(row, 40)
    assert packed.dtype == torch.uint16
    assert packed.to(torch.int32).tolist() == [[3, 2, 2, 0]]
    assert pack_spec_bits(torch.ones(2, 3, dtype=torch.bool), 3).to(torch.int32).tolist() == [[7, 0], [7, 0]]


def test_packbits_little_bit_order():
    flat = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    assert packbits_little(flat).tolist() == [129, 1]
