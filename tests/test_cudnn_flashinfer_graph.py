"""The cuDNN entry builds the graph FlashInfer 0.5.3 builds for the same call (a decode-shaped
``cudnn_batch_prefill_with_kv_cache`` ran 1.105 ms against FlashInfer's 0.28 ms on the same tensors,
the same library with a different graph, plus a per-call padded-LSE scatter of ~5 kernels).

``flashinfer_graph`` restates, from flashinfer 0.5.3 flashinfer/cudnn/prefill.py (_build_prefill_graph),
what FlashInfer declares for a call with batch_offsets_q/o given and no batch_offsets_stats (the form
the bench's FlashInfer call takes: dispatch/benchmark/cases.py cudnn_args); the fake cuDNN frontend
(tests/test_cudnn_contract.py) records what we declare and computes through those declarations, so the
padded LSE is checked against the fp64 oracle too."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backends import cudnn as adapter
from dispatch.benchmark.cases import paged
from dispatch.problem import AttentionBatch
from test_cudnn_contract import BASE, fake, oracle, rel_error  # noqa: F401 - fake: the fixture

assert fake  # the fixture, used by name below


def flashinfer_graph(q, k_cache, max_q: int, max_kv: int, batch: int, width: int, scale: float, causal: bool,
                     return_lse: bool) -> dict:
    """What flashinfer 0.5.3's _build_prefill_graph declares (dims, strides, ragged offsets, sdpa
    attributes, heuristics) for a paged call with batch_offsets_q/o and without batch_offsets_stats."""
    hq, d = q.shape[1], q.shape[2]
    decl = dict(
        q=((batch, hq, max_q, d), (hq * d, d, d * hq, 1), True),
        k=(tuple(k_cache.shape), tuple(k_cache.stride()), False),
        o=((batch, hq, max_q, d), (max_q * d * hq, d, d * hq, 1), True),
        table=(batch, 1, width, 1),
        sdpa=dict(use_padding_mask=True, attn_scale=scale, generate_stats=return_lse,
                  use_causal_mask_bottom_right=causal, paged_attention_max_seq_len_kv=max_kv),
        heuristics=["A"],
    )
    if return_lse:
        decl["stats"] = ((batch, hq, max_q, 1), (max_q * hq, 1, hq, 1), False)
    return decl


def _declared(g, modes) -> dict:
    def t(x, ragged=True):
        return (tuple(x.dim), tuple(x.stride), x.ragged is not None) if ragged else tuple(x.dim)
    kw = g.sdpa_kwargs
    got = dict(q=t(g.q), k=t(g.k), o=t(g.o), table=t(kw["paged_attention_k_table"], False),
               sdpa={n: kw.get(n) for n in ("use_padding_mask", "attn_scale", "generate_stats",
                                           "use_causal_mask_bottom_right", "paged_attention_max_seq_len_kv")},
               heuristics=modes[-1])
    if g.stats is not None:
        got["stats"] = t(g.stats)
    return got


def _entry_call(q_lens, kv_lens, return_lse=True, seed=0):
    """The problem and batch the cuDNN entry builds for a call with K/V as (pages, Hkv, P, D) views of
    an NHD cache and element offsets given (as dispatch/entries/cudnn.py does), plus that call's
    arguments as FlashInfer's function takes them."""
    c = paged(q_lens=q_lens, kv_lens=kv_lens, seed=seed, num_qo_heads=8, num_kv_heads=2, head_dim=16, page_size=4)
    k_cache, v_cache = c["cache"][:, 0].transpose(1, 2), c["cache"][:, 1].transpose(1, 2)  # HND views of NHD
    b, hq, d = len(q_lens), 8, 16
    max_q, max_kv = max(q_lens), max(kv_lens)
    problem = replace(BASE, entry=adapter.CUDNN_ENTRY, phase="decode" if max_q == 1 else "prefill", kv_layout="HND",
                      num_qo_heads=hq, num_kv_heads=2, head_dim_qk=d, head_dim_vo=d, q_dtype="float32",
                      kv_dtype="float32", out_dtype="float32", page_size=4, device_type="cpu", return_lse=return_lse)
    offsets = (c["qo"] * hq * d).to(torch.int32)
    padded = torch.full((b, max_q, hq), float("nan")) if return_lse else None
    given = dict(seq_q=torch.tensor(q_lens, dtype=torch.int32).view(b, 1, 1, 1), off_q=offsets, off_o=offsets,
                 pool_k=k_cache, pool_v=v_cache)
    if padded is not None:
        given["lse_padded"] = padded
    batch = AttentionBatch(q=c["q"], k=k_cache.permute(0, 2, 1, 3), v=v_cache.permute(0, 2, 1, 3),
                           qo_indptr=c["qo"], kv_lens=c["seq"], out=torch.full((sum(q_lens), hq, d), float("nan")),
                           batch_size=b, max_q_len=max_q, max_kv_len=max_kv, sm_scale=0.25, out_scale=1.0,
                           block_table=c["table"],
                           lse=torch.full((sum(q_lens), hq), float("nan")) if return_lse else None,
                           extras={"cudnn": given})
    expected = flashinfer_graph(c["q"], k_cache, max_q, max_kv, b, c["table"].shape[1], 0.25, True, return_lse)
    return problem, batch, padded, expected


def _heuristics(fake, monkeypatch) -> list:
    modes: list = []
    fake.heur_mode = type("heur_mode", (), {"A": "A", "B": "B", "FALLBACK": "FALLBACK"})
    from test_cudnn_contract import FakeGraph
    monkeypatch.setattr(FakeGraph, "create_execution_plans", lambda self, m: modes.append(list(m)), raising=False)
    return modes


def _assert_padded_lse(problem, batch, padded, q_lens):
    ref_out, ref_lse = oracle(problem, batch)
    assert rel_error(batch.out, ref_out) < 1e-5
    start = 0
    for b, n in enumerate(q_lens):
        assert rel_error(padded[b, :n], ref_lse[start:start + n]) < 1e-5  # base 2, as the oracle's
        assert padded[b, n:].isneginf().all()  # rows past the request's length
        start += n
    assert batch.lse.isnan().all(), "the packed LSE is not written: cuDNN fills the padded one in place"


@pytest.mark.parametrize("q_lens,kv_lens", [((1, 1, 1, 1), (9, 40, 4, 23)),  # decode-shaped (the slow case above)
                                            ((5, 1, 7), (9, 4, 13))])  # prefill: max_q 7, not bucketed
def test_entry_graph_is_flashinfers_and_fills_the_padded_lse(fake, monkeypatch, q_lens, kv_lens):
    modes = _heuristics(fake, monkeypatch)
    problem, batch, padded, expected = _entry_call(q_lens, kv_lens)
    backend = adapter.CudnnBackend()
    plan = backend.plan(problem, batch)
    backend.run(plan, batch)
    assert _declared(fake.graphs[-1], modes) == expected
    assert adapter.UID_OFF_STATS not in adapter.pack_uids(plan.key)  # no per-call LSE offsets
    _assert_padded_lse(problem, batch, padded, q_lens)


def test_entry_graph_without_lse_is_flashinfers(fake, monkeypatch):
    modes = _heuristics(fake, monkeypatch)
    problem, batch, _, expected = _entry_call((1, 1, 1), (9, 30, 17), return_lse=False)
    backend = adapter.CudnnBackend()
    backend.run(backend.plan(problem, batch), batch)
    assert _declared(fake.graphs[-1], modes) == expected


def test_entry_repeat_fills_the_padded_lse_through_the_launcher(fake, monkeypatch):
    """A repeat (Backend.launcher) binds the call's padded buffer and launches nothing but the fill
    of the padded rows, the graph and the base-2 rescale (no offsets multiply, no scatter)."""
    q_lens, kv_lens = (5, 1, 7), (9, 4, 13)
    problem, first, _, _ = _entry_call(q_lens, kv_lens, seed=1)
    backend = adapter.CudnnBackend()
    plan = backend.plan(problem, first)
    backend.run(plan, first)
    launch = backend.launcher(plan, first)
    _, batch, padded, _ = _entry_call(q_lens, kv_lens, seed=2)
    launch(batch)
    _assert_padded_lse(problem, batch, padded, q_lens)


def test_heuristic_fallback_only_when_a_proposes_nothing(fake, monkeypatch):
    modes = _heuristics(fake, monkeypatch)
    from test_cudnn_contract import FakeGraph
    real = FakeGraph.check_support

    def refuse_a_alone(self):
        if modes[-1] == ["A"]:
            raise RuntimeError("no plan from heuristic A")
        return real(self)
    monkeypatch.setattr(FakeGraph, "check_support", refuse_a_alone)
    problem, batch, padded, _ = _entry_call((1, 1), (9, 30))
    backend = adapter.CudnnBackend()
    backend.run(backend.plan(problem, batch), batch)
    assert modes == [["A"], ["A", "FALLBACK"]]
    _assert_padded_lse(problem, batch, padded, (1, 1))


def test_entry_batch_divides_element_offsets_only_for_a_backend_that_reads_them(fake, monkeypatch):
    """With Q's offsets in elements (the seed's form, and the bench's FlashInfer call), the entry's
    batch derives no token indptr for cuDNN, which binds the offsets themselves: FlashInfer's call
    launches no division (on tiny decode calls that kernel made ours up to 1.28x its GPU time). Only
    the plan (once) and a backend that reads ``qo_indptr`` pay the division."""
    _heuristics(fake, monkeypatch)
    q_lens, kv_lens = (1, 1, 1, 1), (9, 40, 4, 23)
    backend = adapter.CudnnBackend()
    problem, first = _entry_batch(q_lens, kv_lens, seed=1)
    plan = backend.plan(problem, first)
    for repeat in (backend.run, lambda p, b: backend.launcher(p, first)(b)):  # a kept plan; an exact repeat
        problem, batch, reference = _entry_batch(q_lens, kv_lens, seed=2, with_reference=True)
        repeat(plan, batch)
        assert batch.__dict__["_qo_indptr"] is None, "cuDNN's call divided the offsets"
        assert rel_error(batch.out, oracle(problem, reference)[0]) < 1e-5
    assert torch.equal(batch.qo_indptr, reference.qo_indptr.to(torch.int32))  # read: divided once, then kept
    assert batch.qo_indptr is batch.qo_indptr


def _entry_batch(q_lens, kv_lens, seed, with_reference=False):
    """The batch ``dispatch/entries/cudnn.py`` builds for ``_entry_call``'s call (no LSE)."""
    from types import SimpleNamespace

    from dispatch.entries import cudnn as entry
    problem, reference, _, _ = _entry_call(q_lens, kv_lens, return_lse=False, seed=seed)
    given, b, (total, hq, d) = reference.extras["cudnn"], len(q_lens), reference.q.shape
    z = SimpleNamespace(total_q=total, hq=hq, dqk=d, hkv=2, dvo=d, out_dtype=torch.float32, batch=b, paged=True,
                        max_q=max(q_lens), one_row_each=None)
    batch = entry._batch(z, reference.q, given["pool_k"], given["pool_v"], 0.25, 1.0, max(q_lens), max(kv_lens),
                         given["seq_q"], reference.kv_lens, reference.block_table, False, given["off_q"],
                         given["off_o"], None, False, torch.full((total, hq, d), float("nan")))
    return (problem, batch, reference) if with_reference else (problem, batch)


# -- on a GPU with cuDNN: the padded LSE FlashInfer's form writes (one-row graphs included) --------
def _cudnn_usable() -> bool:
    from backends import get_backend
    return torch.cuda.is_available() and get_backend("cudnn").available() is None


@pytest.mark.skipif(not _cudnn_usable(), reason="needs a CUDA GPU with cuDNN (run on the GPU host)")
@pytest.mark.parametrize("q_lens,kv_lens", [((1,) * 8, (300, 17, 4096, 64, 1, 999, 128, 2048)),
                                            ((5, 1, 77), (90, 4, 1300))])
def test_gpu_entry_padded_lse_matches_fp64(q_lens, kv_lens):
    """The graph fix on the hardware: a one-row graph's Stats and a padded Stats without ragged
    offsets are written (rows past a request's length stay -inf), out and LSE against fp64."""
    import dispatch
    import oracle as fp64
    from dispatch.benchmark.cases import cudnn_args

    c = paged(q_lens=q_lens, kv_lens=kv_lens, dtype=torch.bfloat16, device="cuda", num_qo_heads=32,
              num_kv_heads=8, head_dim=128, page_size=16)
    args, kw = cudnn_args(c, return_lse=True)
    with dispatch.use_backend("cudnn"):
        out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert dispatch.last_decision().ran in (None, "cudnn")
    k_all = c["cache"][:, 0].double().cpu()
    v_all = c["cache"][:, 1].double().cpu()
    start, qs, ks, vs = 0, [], [], []
    for b, (n, m) in enumerate(zip(q_lens, kv_lens)):
        pages = c["table"][b].long().cpu()
        qs.append(c["q"][start:start + n].double().cpu())
        ks.append(k_all[pages].reshape(-1, 8, 128)[:m])
        vs.append(v_all[pages].reshape(-1, 8, 128)[:m])
        start += n
    ref_out, ref_lse = fp64.batch_attention_fp64(qs, ks, vs, sm_scale=128 ** -0.5, causal=True)
    assert rel_error(out.double().cpu(), ref_out) < 1e-2
    start = 0
    for b, n in enumerate(q_lens):
        assert rel_error(lse[b, :n].double().cpu(), ref_lse[start:start + n]) < 1e-2
        assert lse[b, n:].isneginf().all()
        start += n
