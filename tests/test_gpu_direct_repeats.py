"""On a GPU: the paths that skip FlashInfer's Python layer (every path fast) give the
fp64 oracle's answer on every call, not only the first. fa2 / fa3 through the wrappers on
FlashInfer 0.7.x record the compiled op's arguments on the first run after a plan and call the op
after that (0.5.x builds them); XQA calls its kernel variant's entry. Each call here brings a new
q, new poisoned out and lse buffers and, between calls, new cache contents; the counts show the
later calls did not go through FlashInfer's public run.

Runs on the GPU host (``pytest tests/test_gpu_direct_repeats.py``); without CUDA every test skips.
"""
import pytest
import torch

import dispatch
from oracle import BANDS, attention_fp64, batch_attention_fp64, packbits_little, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
HQ, HKV, D, P, DT = 32, 8, 128, 16, torch.bfloat16
Q_LENS, KV_LENS = (7, 1, 33), (40, 17, 300)
CALLS = 4


def flashinfer_version() -> str:
    flashinfer = pytest.importorskip("flashinfer")
    return getattr(flashinfer, "__version__", "")


def counted(monkeypatch, owner, name: str, calls=None) -> list:
    """Count the calls of ``owner.name`` (FlashInfer's public run or function) in ``calls`` and
    still make them."""
    calls, fn = [] if calls is None else calls, getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    monkeypatch.setattr(owner, name, counting)
    return calls


def poisoned(*shape, dtype=DT) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def indptr(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def oracle(q, ks, vs, scale):
    qs = torch.split(q, list(Q_LENS))
    return batch_attention_fp64(qs, ks, vs, sm_scale=scale, causal=True)


def check(out, lse, want) -> None:
    assert relative_error(out, want[0]) < BANDS["bfloat16"]
    assert (lse.double().cpu() - want[1].cpu()).abs().max().item() < 1e-2


def paged_case(layout: str):
    """A 5-D cache with shuffled pages, its FlashInfer page lists, and the per-request K / V."""
    pages = [-(-n // P) for n in KV_LENS]
    order = torch.randperm(sum(pages), device="cuda").to(torch.int32)
    shape = (sum(pages), 2, P, HKV, D) if layout == "NHD" else (sum(pages), 2, HKV, P, D)
    cache = torch.randn(*shape, dtype=DT, device="cuda")
    last = torch.tensor([(n - 1) % P + 1 for n in KV_LENS], dtype=torch.int32, device="cuda")

    def per_request(part: int) -> list:
        start, views = 0, []
        for n, kv in zip(pages, KV_LENS):
            block = cache[order[start:start + n].long(), part]
            tokens = block.reshape(-1, HKV, D) if layout == "NHD" else block.transpose(1, 2).reshape(-1, HKV, D)
            views.append(tokens[:kv])
            start += n
        return views
    return cache, (indptr(Q_LENS), indptr(pages), order, last), per_request


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_wrapper_repeats_agree_with_the_oracle(monkeypatch, backend, layout):
    import flashinfer
    version = flashinfer_version()
    cache, index, per_request = paged_case(layout)
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), layout)
    with dispatch.use_backend(backend):
        w.plan(*index, HQ, HKV, D, P, causal=True, q_data_type=DT)
        public = counted(monkeypatch, flashinfer.BatchPrefillWithPagedKVCacheWrapper, "run")
        for _ in range(CALLS):
            cache.normal_()  # the engine writes its cache between calls
            q = torch.randn(sum(Q_LENS), HQ, D, dtype=DT, device="cuda")
            out, lse = poisoned(sum(Q_LENS), HQ, D), poisoned(sum(Q_LENS), HQ, dtype=torch.float32)
            w.run(q, cache, out=out, lse=lse, return_lse=True)
            check(out, lse, oracle(q, per_request(0), per_request(1), D ** -0.5))
    assert (w.decision.ran or w.decision.chosen) == backend, w.decision.explain()
    if version.startswith(("0.5.", "0.7.")):
        assert len(public) <= 1, f"{backend} on FlashInfer {version}: {len(public)} public runs of {CALLS}"


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_ragged_wrapper_repeats_agree_with_the_oracle(monkeypatch, backend):
    import flashinfer
    version = flashinfer_version()
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    with dispatch.use_backend(backend):
        w.plan(indptr(Q_LENS), indptr(KV_LENS), HQ, HKV, D, causal=True, q_data_type=DT)
        public = counted(monkeypatch, flashinfer.BatchPrefillWithRaggedKVCacheWrapper, "run")
        for _ in range(CALLS):
            q = torch.randn(sum(Q_LENS), HQ, D, dtype=DT, device="cuda")
            k, v = (torch.randn(sum(KV_LENS), HKV, D, dtype=DT, device="cuda") for _ in range(2))
            out, lse = poisoned(sum(Q_LENS), HQ, D), poisoned(sum(Q_LENS), HQ, dtype=torch.float32)
            w.run(q, k, v, out=out, lse=lse, return_lse=True)
            want = oracle(q, torch.split(k, list(KV_LENS)), torch.split(v, list(KV_LENS)), D ** -0.5)
            check(out, lse, want)
    assert (w.decision.ran or w.decision.chosen) == backend, w.decision.explain()
    if version.startswith(("0.5.", "0.7.")):
        assert len(public) <= 1, f"{backend} on FlashInfer {version}: {len(public)} public runs of {CALLS}"


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_a_device_k_scale_is_honoured_on_every_call(backend):
    """run(..., k_scale=<0-dim device tensor>) scales the logits by its value on each call, the
    recorded op's calls included (a plan's float scale must not stand in for it)."""
    cache, index, per_request = paged_case("NHD")
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    q = torch.randn(sum(Q_LENS), HQ, D, dtype=DT, device="cuda")
    with dispatch.use_backend(backend):
        w.plan(*index, HQ, HKV, D, P, causal=True, q_data_type=DT)
        for k_scale in (1.0, 1.0, 0.25, 0.25, 3.0):
            out, lse = w.run(q, cache, k_scale=torch.tensor(k_scale, device="cuda"), return_lse=True)
            check(out, lse, oracle(q, per_request(0), per_request(1), D ** -0.5 * k_scale))


def test_xqa_repeats_agree_with_the_oracle(monkeypatch):
    flashinfer = pytest.importorskip("flashinfer")
    version = flashinfer_version()
    batch, lens_max = 5, 300
    pages_per = -(-lens_max // P)
    cache = torch.randn(batch * pages_per, 2, P, HKV, D, dtype=DT, device="cuda")
    table = torch.randperm(batch * pages_per, device="cuda").to(torch.int32).view(batch, pages_per)
    workspace = torch.zeros(1 << 24, dtype=torch.uint8, device="cuda")
    public: list = []
    for owner in (flashinfer, getattr(flashinfer, "decode", None)):  # 0.7.2 exports it from decode only
        if owner is not None and "xqa_batch_decode_with_kv_cache" in vars(owner):
            counted(monkeypatch, owner, "xqa_batch_decode_with_kv_cache", public)
    for call in range(CALLS):
        cache.normal_()
        lens = torch.randint(1, lens_max + 1, (batch,), dtype=torch.int32, device="cuda")
        q = torch.randn(batch, HQ, D, dtype=DT, device="cuda")
        out = poisoned(batch, HQ, D)
        with dispatch.use_backend("xqa"):
            dispatch.xqa_batch_decode_with_kv_cache(q, cache, workspace, table, lens, lens_max, D ** -0.5, 1.0,
                                                    out=out)
        ks, vs = [], []
        for b, n in enumerate(lens.tolist()):
            pages = cache[table[b].long()]  # (pages, 2, P, HKV, D)
            ks.append(pages[:, 0].reshape(-1, HKV, D)[:n])
            vs.append(pages[:, 1].reshape(-1, HKV, D)[:n])
        want, _ = batch_attention_fp64(list(q.unsqueeze(1)), ks, vs, sm_scale=D ** -0.5, causal=True)
        assert relative_error(out, want) < BANDS["bfloat16"], f"call {call}"
    assert dispatch.last_decision().chosen == "xqa"
    if version.startswith(("0.5.", "0.7.")):
        assert not public, f"xqa on FlashInfer {version}: {len(public)} calls of its public function"


@pytest.mark.parametrize("form", ["custom_mask", "packed_custom_mask"])
def test_single_prefill_with_a_mask_repeats_agree_with_the_oracle(monkeypatch, form):
    """fa2's single-request op with a custom mask: the mask is packed per call (as FlashInfer's own
    function does), so each call's new mask is the one applied; the public function is not called."""
    flashinfer = pytest.importorskip("flashinfer")
    version = flashinfer_version()
    q_len, kv_len = 37, 203
    public = counted(monkeypatch, flashinfer.prefill, "single_prefill_with_kv_cache")
    for call in range(CALLS):
        q = torch.randn(q_len, HQ, D, dtype=DT, device="cuda")
        k, v = (torch.randn(kv_len, HKV, D, dtype=DT, device="cuda") for _ in range(2))
        mask = torch.rand(q_len, kv_len, device="cuda") < 0.6
        mask[:, 0] = True  # no query without a key
        given = {form: mask if form == "custom_mask" else packbits_little(mask.reshape(-1)).cuda()}
        with dispatch.use_backend("fa2"):
            out, lse = dispatch.single_prefill_with_kv_cache(q, k, v, return_lse=True, **given)
        want = attention_fp64(q, k, v, mask=mask, sm_scale=D ** -0.5)
        assert relative_error(out, want[0]) < BANDS["bfloat16"], f"call {call}"
        assert (lse.double().cpu() - want[1].cpu()).abs().max().item() < 1e-2, f"call {call}"
    assert dispatch.last_decision().chosen == "fa2"
    if version.startswith(("0.5.", "0.7.")):
        assert not public, f"fa2 on FlashInfer {version}: {len(public)} calls of its public function"
