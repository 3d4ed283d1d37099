"""torch-flash adapter contract on the CPU with a fake ``aten._flash_attention_forward``.

The fake computes FA2's varlen semantics in fp64 from exactly the arguments it is
handed (cum_seq_q/k, window_size_left/right, is_causal, scale) and returns FA2's
natural-log, head-major LSE (or the padded (B, H, max_q) form some builds return),
so comparing the adapter's out / lse with the fp64 oracle checks the translation.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from backends import BackendRejected, _numerics
from backends import torch_flash as adapter
from capability_db import resolve_device
from dispatch.benchmark.probe import BASE, Case, make_batch, oracle, rel_error

CPU = torch.device("cpu")
H100 = resolve_device("h100")


class FakeFlash:
    def __init__(self, padded_lse=False):
        self.calls, self.padded_lse = [], padded_lse

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale=None,
                 window_size_left=None, window_size_right=None, **rest):
        self.calls.append(dict(cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, causal=causal, scale=scale,
                               left=window_size_left, right=window_size_right, q=q))
        out = torch.empty_like(q)
        lse = torch.full((cu_q.numel() - 1, q.shape[1], max_q), float("nan")) if self.padded_lse else \
            torch.empty(q.shape[1], q.shape[0])
        for b in range(cu_q.numel() - 1):
            q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
            o, l = self._request(q[q0:q1], k[k0:k1], v[k0:k1], causal, scale, window_size_left, window_size_right)
            out[q0:q1] = o.to(out.dtype)
            if self.padded_lse:
                lse[b, :, : q1 - q0] = l
            else:
                lse[:, q0:q1] = l
        return out, lse, None, None, None

    @staticmethod
    def _request(q, k, v, causal, scale, left, right):
        group = q.shape[1] // k.shape[1]
        k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
        lq, lk = q.shape[0], k.shape[0]
        pos = torch.arange(lq)[:, None] + lk - lq  # FA2: bottom-right aligned
        key = torch.arange(lk)[None, :]
        if causal or right == 0:
            s = s.masked_fill(key > pos, float("-inf"))
        if left is not None and left >= 0:
            s = s.masked_fill(key < pos - left, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]).nan_to_num(0.0), v)
        return o, torch.where(torch.isinf(lse), torch.full_like(lse, float("inf")), lse)  # FA2: +inf for empty rows


@pytest.fixture
def fake(monkeypatch):
    op = FakeFlash()
    monkeypatch.setattr(adapter, "flash_op", lambda: op)
    return op


def case(name="c", lens=((7, 33, 2), (47, 33, 72)), **changes) -> Case:
    problem = replace(BASE, **{"kv_storage": "ragged", "page_size": 0, "q_dtype": "float32", "kv_dtype": "float32",
                               "out_dtype": "float32", "device_type": "cpu", **changes})
    return Case(name, problem, *lens)


def run(c: Case, seed=0):
    backend = adapter.TorchFlashBackend()
    batch = make_batch(c, CPU, seed=seed)
    backend.run(backend.plan(c.problem, batch), batch)
    return batch


SCENARIOS = {
    "prefill_causal_gqa": {}, "prefill_noncausal": dict(causal=False), "prefill_window6": dict(window_left=6),
    "prefill_window6_noncausal": dict(window_left=6, causal=False), "prefill_mha": dict(num_kv_heads=8),
    "dense": dict(kv_storage="dense", _lens=((16, 16), (16, 16))),
    "decode": dict(phase="decode", _lens=((1, 1, 1), (40, 3, 129))),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_translation_matches_fp64_oracle(fake, name):
    changes = dict(SCENARIOS[name])
    lens = changes.pop("_lens", ((7, 33, 2), (47, 33, 72)))
    c = case(name, lens, **changes)
    batch = run(c, seed=len(name))
    ref_out, ref_lse = oracle(c.problem, batch)
    assert not torch.isnan(batch.out).any() and not torch.isnan(batch.lse).any()
    assert rel_error(batch.out, ref_out) < 1e-5 and rel_error(batch.lse, ref_lse) < 1e-5


def test_varlen_arguments_handed_over(fake):
    c = case("args", window_left=6)
    batch = run(c)
    call = fake.calls[-1]
    assert call["cu_q"] is batch.qo_indptr and call["cu_k"] is batch.kv_indptr
    assert (call["max_q"], call["max_k"]) == (33, 72) and call["causal"] is True
    assert (call["left"], call["right"]) == (6, 0) and call["scale"] == pytest.approx(1 / 128 ** 0.5)
    assert _numerics.torch_flash_window(6, False) == (6, -1)
    assert _numerics.torch_flash_window(-1, True) == (None, None)


def test_padded_lse_layout_is_unpacked(monkeypatch):
    op = FakeFlash(padded_lse=True)
    monkeypatch.setattr(adapter, "flash_op", lambda: op)
    c = case("padded")
    batch = run(c, seed=4)
    assert rel_error(batch.lse, oracle(c.problem, batch)[1]) < 1e-5


def test_tensor_scales_are_folded(fake):
    c = replace(case("scales"), out_scale=0.5, tensor_scales=True)
    batch = run(c, seed=2)
    ref_out, ref_lse = oracle(c.problem, batch)
    assert fake.calls[-1]["scale"] == 1.0 and fake.calls[-1]["q"] is not batch.q
    assert rel_error(batch.out, ref_out) < 1e-5 and rel_error(batch.lse, ref_lse) < 1e-5


def test_empty_rows_get_minus_inf():
    lse = torch.tensor([[0.5, float("inf")], [1.0, 2.0]])  # (H, total_q) natural log
    out = torch.full((2, 2), float("nan"))
    _numerics.write_lse_base2(out, lse)
    assert out[1, 0] == float("-inf") and out[0, 0] == pytest.approx(0.5 / math.log(2))
    assert out[1, 1] == pytest.approx(2.0 / math.log(2))


def test_paged_is_refused_at_plan_time(fake):
    c = Case("paged", replace(BASE, q_dtype="float32", kv_dtype="float32", out_dtype="float32"), (3,), (20,))
    with pytest.raises(BackendRejected) as info:
        adapter.TorchFlashBackend().plan(c.problem, make_batch(c, CPU))
    assert info.value.reasons[0].field == "kv_storage" and not fake.calls


@pytest.mark.parametrize("changes,field", [
    (dict(kv_storage="paged", page_size=16), "kv_storage"), (dict(logits_soft_cap=5.0), "has_soft_cap"),
    (dict(has_sinks=True), "has_sinks"), (dict(head_dim_qk=192), "same_head_dims"),
    (dict(head_dim_qk=72, head_dim_vo=72), None), (dict(pos_encoding="ALIBI"), "pos_encoding"),
    (dict(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn"), "q_dtype"),
])
def test_capability_data(changes, field):
    problem = replace(BASE, **{"kv_storage": "ragged", "page_size": 0, **changes})
    reasons = adapter.TorchFlashBackend().check(problem, H100)
    assert [r.field for r in reasons][:1] == ([field] if field else [])


def test_negative_scale_is_refused_before_launch(fake):
    """PyTorch's FA2 keeps the row max of unscaled scores: sm_scale < 0 goes to another backend."""
    backend = adapter.TorchFlashBackend()
    batch = make_batch(case("neg"), CPU)
    batch.sm_scale = -0.2
    with pytest.raises(BackendRejected) as err:
        backend.plan(case("neg").problem, batch)
    assert [(r.field, r.value) for r in err.value.reasons] == [("sm_scale", -0.2)]
    batch.sm_scale = 0.2
    plan = backend.plan(case("neg").problem, batch)
    batch.sm_scale, calls = -0.2, len(fake.calls)
    with pytest.raises(BackendRejected):
        backend.run(plan, batch)
    assert len(fake.calls) == calls, "the op was called"
