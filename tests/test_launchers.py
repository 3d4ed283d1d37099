"""Backend launchers (``Backend.launcher``): the entry points' fast lanes hand exact repeats to the
backend's launcher instead of router.run, and each launcher does what ``run`` would.

Entry wiring is checked on the CPU with the reference backend given a counting launcher (the GPU
path driven with CPU tensors: ``gpu_like``); the vendor launchers against fake vendor entries
that record their arguments, beside the same call through ``run``."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

import _fake_vendors as fv
import dispatch

from backends import BackendRejected, _vendor, get_backend
from backends.xqa import DirectXqa, XqaBackend, XqaPlan
from dispatch.entries import _base
from dispatch.benchmark.cases import cudnn_args, paged, paged_wrapper, ragged, ragged_wrapper, trtllm_args, xqa_args


@pytest.fixture
def counting_launcher(monkeypatch):
    """The reference backend with a launcher that counts its launches (and runs ``run``)."""
    backend = get_backend("reference")
    calls = {"built": 0, "launched": 0, "reject": 0}

    def launcher(plan, batch):
        calls["built"] += 1

        def launch(b):
            if calls["reject"]:
                calls["reject"] -= 1
                raise BackendRejected("reference", [])
            calls["launched"] += 1
            backend.run(plan, b)
        return launch

    monkeypatch.setattr(backend, "launcher", launcher, raising=False)
    return calls


def _entry_calls():
    c, r = paged(), ragged()

    def fresh(t):  # same shape, dtype and strides; other data
        return torch.randn_like(t)

    def xqa():
        args, kw = xqa_args(c)
        return lambda: dispatch.xqa_batch_decode_with_kv_cache(fresh(args[0]), *args[1:], **kw)

    def trtllm():
        args, kw = trtllm_args(c)
        return lambda: dispatch.trtllm_batch_context_with_kv_cache(fresh(args[0]), *args[1:], **kw)

    def single():
        return lambda: dispatch.single_prefill_with_kv_cache(fresh(r["q"]), r["k"], r["v"], causal=True)

    def cudnn():
        args, kw = cudnn_args(c)
        return lambda: dispatch.cudnn_batch_prefill_with_kv_cache(fresh(args[0]), *args[1:], **kw)

    def paged_run():
        w = paged_wrapper(c)
        return lambda: w.run(fresh(c["q"]), c["cache"])

    def ragged_run():
        w = ragged_wrapper(r)
        return lambda: w.run(fresh(r["q"]), r["k"], r["v"])

    return {"xqa": xqa, "trtllm": trtllm, "single": single, "cudnn": cudnn, "paged_run": paged_run,
            "ragged_run": ragged_run}


@pytest.mark.parametrize("entry", sorted(_entry_calls()))
def test_repeats_take_the_launcher(gpu_like, counting_launcher, entry):
    """The first call runs the backend and asks for no launcher (a call made once, as a serving
    stream's new batches are, never pays for one); the first repeat asks once and launches through
    it, as later repeats do, with the results the checked path gives for the same data."""
    entry_call = _entry_calls()[entry]()

    def call():  # the output (cuDNN's entry returns (out, lse))
        res = entry_call()
        return res[0] if isinstance(res, tuple) else res
    torch.manual_seed(1)
    first = call().clone()
    assert counting_launcher == {"built": 0, "launched": 0, "reject": 0}
    torch.manual_seed(2)
    repeat = call().clone()
    assert counting_launcher == {"built": 1, "launched": 1, "reject": 0}
    torch.manual_seed(2)
    again = call().clone()
    torch.manual_seed(2)
    third = call()
    assert counting_launcher["launched"] == 3 and counting_launcher["built"] == 1
    assert torch.equal(repeat, again) and torch.equal(again, third) and not torch.equal(first, repeat)
    _base.CPU_VALUE_CHECKS = True  # the checked path (no lane) on the same data
    torch.manual_seed(2)
    checked = call()
    assert counting_launcher["launched"] == 3
    assert torch.equal(checked, repeat)


def test_after_a_repeated_batch_a_new_one_takes_its_launcher_on_its_first_call(gpu_like, counting_launcher):
    """An engine's decode steps: each new batch is called once per layer. Once a batch repeated, the next
    new batch asks for its launcher on its first call and launches through it; a stream whose batches
    are each called once (none repeated) never builds one."""
    c = paged()
    args, kw = xqa_args(c)

    def call(rows, bound=0):  # the first ``rows`` requests, max_seq_len raised by ``bound``: a new lane
        q, table, seq = args[0][:rows], args[3][:rows], args[4][:rows]
        return dispatch.xqa_batch_decode_with_kv_cache(q, args[1], args[2], table, seq, args[5] + bound, *args[6:],
                                                       **kw)
    rows = len(c["kv_lens"])
    for n in range(1, rows + 1):
        call(n)
    assert counting_launcher == {"built": 0, "launched": 0, "reject": 0}
    call(rows)
    assert counting_launcher == {"built": 1, "launched": 1, "reject": 0}
    expected = call(1, bound=1).clone()  # a lane never called before
    assert counting_launcher == {"built": 2, "launched": 2, "reject": 0}
    _base.CPU_VALUE_CHECKS = True  # the checked path on the same data
    assert torch.equal(call(1, bound=1), expected)


def test_a_launcher_refusal_is_handed_back_to_the_router(gpu_like, counting_launcher):
    c = paged()
    w = paged_wrapper(c)
    expected = w.run(c["q"], c["cache"]).clone()
    counting_launcher["reject"] = 1
    again = w.run(c["q"], c["cache"])  # the launcher refuses: router.run serves the call
    assert torch.equal(again, expected) and w.decision.ran == "reference"
    args, kw = xqa_args(c)
    expected = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw).clone()
    dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    counting_launcher["reject"] = 1
    assert torch.equal(dispatch.xqa_batch_decode_with_kv_cache(*args, **kw), expected)


def test_no_launcher_for_a_tensor_scale(gpu_like, counting_launcher):
    """A device scale is folded per call (its value is not in the key): never a launcher."""
    c = paged()
    w = paged_wrapper(c)
    for _ in range(3):
        w.run(c["q"], c["cache"], k_scale=torch.tensor(0.5))
    assert counting_launcher["built"] == 0


# -- FlashInfer fa2's single-request op -----------------------------------------------------------
@pytest.fixture
def fake_flashinfer(monkeypatch):
    rec = fv.Recorder()
    fv.install_flashinfer(monkeypatch, rec)
    yield rec
    _vendor.forget_imports()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fa2_single_launcher_matches_run_and_fp64(fake_flashinfer, layout):
    p = fv.make_problem(kv_storage="dense", kv_layout=layout, causal=True, window_left=5, return_lse=True)
    batch, _ = fv.make_batch(p, [6], [11], lse=True)
    fa2 = get_backend("fa2")
    plan = fa2.plan(p, batch)
    fa2.run(plan, batch)
    launch = fa2.launcher(plan, batch)
    assert launch is not None
    nxt, refs = fv.make_batch(p, [6], [11], lse=True)  # other data, same facts
    nxt.out.fill_(float("nan"))
    nxt.lse.fill_(float("nan"))
    launch(nxt)
    call = fake_flashinfer.last("single_prefill_op")
    assert call["q"] is nxt.q and call["o"] is nxt.out and call["lse"] is nxt.lse
    assert call["layout"] == (1 if layout == "HND" else 0) and call["sm_scale"] == nxt.sm_scale
    out_ref, lse_ref = fv.reference(p, nxt, refs)
    assert ((nxt.out.double() - out_ref).norm() / out_ref.norm()) < 1e-2
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(nxt.lse.double()[fin], lse_ref[fin], rtol=1e-5, atol=1e-5)


def test_fa2_single_launcher_packs_each_calls_own_mask(fake_flashinfer):
    """A repeated masked call's launcher packs the mask of that call, not the first call's."""
    p = fv.make_problem(kv_storage="dense", mask="custom", return_lse=True)
    batch, _ = fv.make_batch(p, [6], [11], custom_mask=True, lse=True)
    fa2 = get_backend("fa2")
    plan = fa2.plan(p, batch)
    fa2.run(plan, batch)
    launch = fa2.launcher(plan, batch)
    assert launch is not None
    nxt, refs = fv.make_batch(p, [6], [11], custom_mask=True, lse=True)
    # make_batch draws the same mask: another one here (flat reversed = the (q, kv) mask turned over)
    nxt.custom_mask = nxt.custom_mask.flip(0)
    refs = (*refs[:2], [m.flip(0).flip(1) for m in refs[2]])
    assert not torch.equal(nxt.custom_mask, batch.custom_mask)
    nxt.out.fill_(float("nan"))
    launch(nxt)
    assert fake_flashinfer.last("packbits")["x"] is nxt.custom_mask
    out_ref, _ = fv.reference(p, nxt, refs)
    assert ((nxt.out.double() - out_ref).norm() / out_ref.norm()) < 1e-2


def test_fa2_launcher_refuses_what_the_key_does_not_prove(fake_flashinfer):
    p = fv.make_problem(kv_storage="dense", causal=True)
    batch, _ = fv.make_batch(p, [4], [9])
    fa2 = get_backend("fa2")
    plan = fa2.plan(p, batch)
    batch.out_scale = 0.5  # applied after the kernel by run: not the launcher's
    assert fa2.launcher(plan, batch) is None
    batch.out_scale, batch.sm_scale = 1.0, torch.tensor(0.3)  # a device scale: read per call
    assert fa2.launcher(plan, batch) is None


# -- XQA's compiled entry -------------------------------------------------------------------------
def _recording_xqa(calls: list, abi: str = "0.5"):
    def run(*args):
        calls.append(args)
    return DirectXqa(run, False, 132, 2, 0, 16, 8.0, torch.empty(4), torch.empty(4), True, abi)


def _same_args(a: tuple, b: tuple, n: int = 21) -> None:
    assert len(a) == len(b) == n
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
        else:
            assert x == y


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("abi, n, q_at", [("0.5", 21, 8), ("0.7", 24, 7)])
def test_xqa_launcher_passes_what_the_direct_launch_passes(sinks, abi, n, q_at):
    """The launcher's arguments (FlashInfer 0.5's 21 or 0.7's 24) are those ``_launch_direct``
    builds for the same batch; 0.7's entry takes q with a unit query axis, as FlashInfer passes it."""
    c = paged(q_lens=(1, 1, 1))
    q = torch.randn(3, 4, 16)
    k, v = _base.paged_kv(c["cache"], "NHD")
    from dispatch.problem import AttentionBatch
    batch = AttentionBatch(q=q, k=k, v=v, qo_indptr=torch.arange(4, dtype=torch.int32),
                           kv_lens=torch.tensor([9, 4, 13], dtype=torch.int32), out=torch.empty(3, 4, 16), batch_size=3,
                           max_q_len=1, max_kv_len=13, sm_scale=0.25, out_scale=1.0, block_table=c["table"],
                           sinks=torch.randn(4) if sinks else None)
    calls: list = []
    plan = XqaPlan(None, None, direct=_recording_xqa(calls, abi))
    XqaBackend._launch_direct(plan.direct, batch)
    launch = XqaBackend().launcher(plan, batch)
    launch(batch)
    _same_args(calls[0], calls[1], n)
    assert calls[1][4] == 0.25 * 8.0  # q_scale = bmm1_scale * sqrt(head_dim)
    assert calls[1][q_at].data_ptr() == q.data_ptr() and calls[1][q_at].shape == ((3, 4, 16) if abi == "0.5" else (3, 1, 4, 16))
    batch.out_scale = 2.0  # scaled after the kernel by run: not a launcher's
    assert XqaBackend().launcher(plan, batch) is None


def test_xqa_direct_reads_strided_index_tensors_row_major():
    """The compiled entry takes only data pointers: a page table sliced from a wider one and
    every-other lengths go over as row-major copies (the values the call meant), and a launcher
    is not built for them (it would bind the strided tensors' pointers)."""
    c = paged(q_lens=(1, 1, 1))
    k, v = _base.paged_kv(c["cache"], "NHD")
    wide = torch.cat([c["table"], torch.full_like(c["table"], 10**6)], dim=1)
    lens = torch.tensor([[9, -1], [4, -1], [13, -1]], dtype=torch.int32)
    from dispatch.problem import AttentionBatch
    batch = AttentionBatch(q=torch.randn(3, 4, 16), k=k, v=v, qo_indptr=torch.arange(4, dtype=torch.int32),
                           kv_lens=lens[:, 0], out=torch.empty(3, 4, 16), batch_size=3, max_q_len=1, max_kv_len=13,
                           sm_scale=0.25, out_scale=1.0, block_table=wide[:, :c["table"].shape[1]])
    calls: list = []
    plan = XqaPlan(None, None, direct=_recording_xqa(calls))
    XqaBackend._launch_direct(plan.direct, batch)
    table, kv_capacity, seq_lens = calls[0][12], calls[0][13], calls[0][14]
    assert table.is_contiguous() and torch.equal(table, c["table"]) and kv_capacity == c["table"].shape[1] * 16
    assert seq_lens.is_contiguous() and seq_lens.tolist() == [9, 4, 13]
    assert XqaBackend().launcher(plan, batch) is None



# -- fa2's compiled batch run (FlashInfer 0.5.3's wrapper attributes) ------------------------------
def _fi053_wrapper(paged: bool, calls: list):
    """The attributes FlashInfer 0.5.3's wrapper has after plan() (flashinfer/prefill.py): the
    ragged wrapper keeps no _num_qo_heads (its run reads q.shape[1])."""
    from types import SimpleNamespace

    def record(name):
        return lambda *args: calls.append((name, args))
    w = SimpleNamespace(
        _jit_module=None, _prefix_len_ptr=None, _backend="fa2", _plan_info=[1, 2], _custom_mask_buf=None,
        _causal=True, _float_workspace_buffer=torch.empty(8), _int_workspace_buffer=torch.empty(8),
        _kv_layout="NHD", _window_left=-1, _mask_indptr_buf=None, _token_pos_in_items_ptr=None,
        _max_item_len_ptr=None, _logits_soft_cap=None, _rope_scale=None, _rope_theta=None,
        _token_pos_in_items_len=0, _qo_indptr_buf=torch.tensor([0, 1]), _kv_indptr_buf=torch.tensor([0, 4]),
        _cached_module=SimpleNamespace(paged_run=record("paged_run"), ragged_run=record("ragged_run")))
    if paged:
        w.__dict__.update(_num_qo_heads=4, _num_kv_heads=2, _paged_kv_indptr_buf=torch.tensor([0, 1]),
                          _paged_kv_indices_buf=torch.tensor([0]), _paged_kv_last_page_len_buf=torch.tensor([4]),
                          _workspace_size=8, _block_tables=None, _kv_lens_buffer=torch.tensor([4]), _max_q_len=1,
                          _max_kv_len=4, _batch_size=1, _vector_sparse_indptr_buffer=torch.empty(2))
    return w


@pytest.mark.parametrize("paged_kv", [True, False])
def test_fa2_compiled_run_with_flashinfer_053_attributes(fake_flashinfer, monkeypatch, paged_kv):
    """The compiled run is found for both wrappers (a missing attribute silently kept FlashInfer's
    Python run for the ragged one), and it receives the call's tensors and the plan's scale in
    FlashInfer 0.5.3's positions (q, k, v at 3-5; out, lse after the index buffers)."""
    from backends._fi_prefill import FiState, FlashInferPrefill
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    calls: list = []
    provider = FlashInferPrefill("fa2")
    plan_args = ((None,) * 4 + (4, 2, 16, 16)) if paged_kv else (None, None, 4, 2, 16)
    state = FiState(_fi053_wrapper(paged_kv, calls), plan_args, {"sm_scale": 0.3}, paged_kv)
    direct = provider._direct_run(state)
    assert direct is not None
    q, k, v, out, lse = (torch.randn(2) for _ in range(5))
    direct(q, k, v, out, lse)
    name, args = calls[-1]
    assert name == ("paged_run" if paged_kv else "ragged_run")
    at = (3, 4, 5, 10, 11, 23) if paged_kv else (3, 4, 5, 8, 9, 21)
    assert [args[i] for i in at[:5]] == [q, k, v, out, lse] and args[at[5]] == 0.3
    assert len(args) == (42 if paged_kv else 25)


def test_cudnn_entry_decode_without_offsets_takes_cached_offsets(monkeypatch):
    """A decode-shaped cuDNN entry call (one query row per request) without batch offsets: the
    checks hold every length to 1 (q has one row per token), so request b is row b, read from
    cached offsets (no prefix-sum kernel per call), as FlashInfer's own call declares Q; the
    result equals the call with the packed offsets given."""
    from dispatch.entries import cudnn as entry
    c = paged(q_lens=(1, 1, 1), kv_lens=(9, 4, 13))
    args, kw = cudnn_args(c, causal=False)
    given, _ = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    given = given.clone()
    kw.pop("batch_offsets_q"), kw.pop("batch_offsets_o")

    def no_prefix_sums(lens):
        raise AssertionError("a prefix sum was computed for a decode-shaped call")
    monkeypatch.setattr(entry, "_cumsum0", no_prefix_sums)
    derived, _ = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert torch.equal(derived, given)
    kw["actual_seq_lens_q"] = torch.tensor([1, 0, 1], dtype=torch.int32).view(3, 1, 1, 1)
    with pytest.raises(ValueError, match="q.shape"):  # a length 0 leaves a row no token owns
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)


def test_fa2_batch_launcher_never_runs_another_lanes_scale(fake_flashinfer, monkeypatch):
    """The FlashInfer wrapper state is shared by the lanes of one plan, and a lane with another
    float scale re-plans it (FlashInfer bakes sm_scale into its plan): a launcher made at scale 0.3
    must then hand its call to run (which re-plans at 0.3), never launch the plan made at 0.5."""
    from types import SimpleNamespace
    from backends._fi_prefill import FiState, FlashInferPrefill
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    calls: list = []
    provider = FlashInferPrefill("fa2")
    wrapper = _fi053_wrapper(False, calls)
    state = FiState(wrapper, (None, None, 4, 2, 16), {"sm_scale": 0.3}, False)
    state.direct = provider._direct_run(state)
    state.held.last = state  # the wrapper's last plan
    problem = SimpleNamespace(kv_layout="NHD")
    batch = SimpleNamespace(q=torch.randn(2), k=torch.randn(2), v=torch.randn(2), out=torch.randn(2), lse=None,
                            sm_scale=0.3, out_scale=1.0)
    launch = provider.launcher(problem, state, batch)
    launch(batch)
    assert calls[-1][1][21] == 0.3
    state.plan_kwargs = {"sm_scale": 0.5}  # another lane's run re-planned the shared state at 0.5
    state.direct = provider._direct_run(state)
    handed = []
    monkeypatch.setattr(provider, "run", lambda problem, st, b: handed.append(b.sm_scale))
    launch(batch)
    assert handed == [0.3] and calls[-1][1][21] == 0.3  # nothing launched at 0.5


@contextlib.contextmanager
def checks_forbidden():
    """Inside the block a call that takes the checked path fails the test (its lane must serve)."""
    real = _base.checked  # functions and wrapper runs alike
    _base.checked = lambda *a, **k: pytest.fail("the call was checked again")
    try:
        yield
    finally:
        _base.checked = real


def test_default_option_repeats_take_their_lane(gpu_like):
    """A wrapper's default-option repeat finds its lane by the tensors' facts alone; any option
    (a scale, out, sinks) still builds the full key; results equal the checked path's."""
    c, r = paged(), ragged()
    pw, rw = paged_wrapper(c), ragged_wrapper(r)
    first_p, first_r = pw.run(c["q"], c["cache"]).clone(), rw.run(r["q"], r["k"], r["v"]).clone()
    with checks_forbidden():
        assert torch.equal(pw.run(c["q"], c["cache"]), first_p)
        assert torch.equal(rw.run(r["q"], r["k"], r["v"]), first_r)
    scaled = pw.run(c["q"], c["cache"], k_scale=0.5)  # an option: the full key, another lane
    assert not torch.equal(scaled, first_p)
    assert torch.equal(pw.run(c["q"], c["cache"]), first_p)


def test_default_option_repeats_with_a_k_is_v_cache(gpu_like):
    """A (pages, 1, ...) cache (K is V) never takes the (pages, 2, ...) split of the fast path."""
    c = paged()
    shared = c["cache"][:, :1].clone()
    w = paged_wrapper(c)
    first = w.run(c["q"], shared).clone()
    assert torch.equal(w.run(c["q"], shared), first)


@pytest.mark.parametrize("tuple_cache", [False, True])
def test_xqa_default_option_repeats_take_their_lane(gpu_like, tuple_cache):
    """An XQA decode call with default options finds its lane by a short key (a 5-D cache or a
    (k, v) tuple); a window or sinks still build the full key; results equal the checked path's."""
    c = paged(q_lens=(1, 1, 1))
    args, kw = xqa_args(c)
    if tuple_cache:
        args[1] = (c["cache"][:, 0], c["cache"][:, 1])
    first = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw).clone()
    with checks_forbidden():
        assert torch.equal(dispatch.xqa_batch_decode_with_kv_cache(*args, **kw), first)
    windowed = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw, window_left=2)
    assert not torch.equal(windowed, first)


def test_cudnn_default_option_repeats_take_their_lane(gpu_like):
    """A decode-shaped cuDNN entry call with default options (no offsets, out, lse or q/k/v scales)
    finds its lane by a short key; ``out=`` still builds the full key; results equal the checked
    path's, and the float64 oracle's."""
    c = paged(q_lens=(1, 1, 1))
    args, kw = cudnn_args(c)
    for name in ("batch_offsets_q", "batch_offsets_o"):
        kw.pop(name)
    first, _ = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    first = first.clone()
    with checks_forbidden():
        for _ in range(2):
            assert torch.equal(dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)[0], first)
    out = torch.full_like(first, float("nan"))
    assert dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw, out=out)[0] is out
    assert torch.equal(out, first)
    assert (first.double() - _paged_decode_fp64(c)).abs().max() < 1e-5  # fp32 inputs: the fp32 band


def _paged_decode_fp64(c: dict) -> torch.Tensor:
    """One query row per request of an NHD paged case, attending all its keys (float64)."""
    from dispatch.benchmark.oracle import batch_attention_fp64
    ks, vs = [], []
    for b, n in enumerate(c["kv_lens"]):
        pages = c["cache"][c["table"][b].long()]  # (pages, 2, P, Hkv, D)
        ks.append(pages[:, 0].flatten(0, 1)[:n])
        vs.append(pages[:, 1].flatten(0, 1)[:n])
    qs = list(c["q"].split(c["q_lens"]))
    return batch_attention_fp64(qs, ks, vs, sm_scale=c["head_dim"] ** -0.5, causal=True)[0]


def test_single_prefill_default_option_repeats_take_their_lane(gpu_like):
    """A single prefill with default options (causal, window and sm_scale may vary: they are in
    the short key) finds its lane without the full key; a soft cap still builds it; results equal
    the checked path's and the float64 oracle's."""
    from dispatch.benchmark.oracle import attention_fp64
    r = ragged(q_lens=(5,), kv_lens=(9,))
    first = dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True).clone()
    windowed = dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True, window_left=2).clone()
    with checks_forbidden():
        assert torch.equal(dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True), first)
        assert torch.equal(dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True, window_left=2),
                           windowed)
    capped = dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True, logits_soft_cap=1.0)
    assert not torch.equal(capped, first)
    for got, window in ((first, -1), (windowed, 2)):
        want, _ = attention_fp64(r["q"], r["k"], r["v"], sm_scale=r["head_dim"] ** -0.5, causal=True,
                                 window_left=window)
        assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["native-triton", "reference"])
def test_decode_with_a_sliced_page_table_and_strided_lengths(gpu_like, backend):
    """A page table sliced from a wider one and every-other lengths give the float64 oracle's
    answer on the first call, the lane's run and the launcher (native-triton read the lengths
    at unit stride: a wrong answer, seen on the H100)."""
    if backend == "native-triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("native-triton takes CPU tensors only in Triton's interpreter; on a GPU host "
                    "test_gpu_entries.py::test_decode_reads_a_sliced_page_table_and_strided_lengths checks it")
    c = paged(q_lens=(1, 1, 1))
    args, kw = xqa_args(c)
    wide = torch.cat([c["table"], torch.zeros_like(c["table"])], dim=1)  # valid but wrong filler pages
    pairs = torch.stack([c["seq"], torch.ones_like(c["seq"])], dim=1)
    args[3], args[4] = wide[:, :c["table"].shape[1]], pairs[:, 0]
    want = _paged_decode_fp64(c)
    with dispatch.use_backend(backend):
        for _ in range(3):
            got = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
            assert dispatch.last_decision().chosen == backend
            assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("tuple_cache", [False, True])
def test_trtllm_default_option_repeats_take_their_lane(gpu_like, tuple_cache):
    """A trtllm context call with default options finds its lane by a short key (a 5-D cache or a
    (k, v) pair); sinks still build the full key; results equal the checked path's."""
    c = paged()
    args, kw = trtllm_args(c)
    if tuple_cache:
        args[1] = (c["cache"][:, 0], c["cache"][:, 1])
    first = dispatch.trtllm_batch_context_with_kv_cache(*args, **kw).clone()
    with checks_forbidden():
        assert torch.equal(dispatch.trtllm_batch_context_with_kv_cache(*args, **kw), first)
    sunk = dispatch.trtllm_batch_context_with_kv_cache(*args, **kw, sinks=torch.randn(c["num_qo_heads"]))
    assert not torch.equal(sunk, first)


def test_a_paged_run_lane_keeps_views_per_cache_and_remakes_them_after_an_in_place_change(gpu_like,
                                                                                       counting_launcher):
    c = paged()
    w = paged_wrapper(c)
    layers = [c["cache"], torch.randn_like(c["cache"])]  # one lane (same facts), two caches
    got = [w.run(c["q"], layers[i % 2]).clone() for i in range(6)]
    assert counting_launcher["launched"] >= 4  # the repeats took the lane
    _base.CPU_VALUE_CHECKS = True  # the checked path (no lane) on the same data
    for i, out in enumerate(got):
        assert torch.equal(out, w.run(c["q"], layers[i % 2]))
    assert not torch.equal(got[0], got[1])
    _base.CPU_VALUE_CHECKS = False
    launched = counting_launcher["launched"]
    layers[1].set_(torch.randn_like(c["cache"]))  # the same object and shape, another memory
    moved = w.run(c["q"], layers[1]).clone()
    assert counting_launcher["launched"] == launched + 1  # still the lane, with views of the new memory
    _base.CPU_VALUE_CHECKS = True
    assert torch.equal(moved, w.run(c["q"], layers[1])) and not torch.equal(moved, got[1])


def test_a_kv_pairs_lane_key_holds_each_tensors_facts_and_the_pair_length(gpu_like, counting_launcher):
    c = paged()
    w = paged_wrapper(c)
    k, v = c["cache"][:, 0], c["cache"][:, 1]
    first = w.run(c["q"], (k, v)).clone()
    w.run(c["q"], (k, v))  # the first repeat asks for the launcher
    assert torch.equal(w.run(c["q"], (k, v)), first) and counting_launcher["launched"] >= 1
    with pytest.raises(ValueError, match="paged_kv_cache"):  # v's dtype differs: checked, refused
        w.run(c["q"], (k, v.to(torch.float64)))
    with pytest.raises((ValueError, TypeError), match="paged_kv_cache"):  # a third tensor: checked, refused
        w.run(c["q"], (k, v, v))
    swapped = w.run(c["q"], (v, k))  # same facts, other data: the lane, on this call's tensors
    _base.CPU_VALUE_CHECKS = True
    assert torch.equal(swapped, w.run(c["q"], (v, k))) and not torch.equal(swapped, first)


def test_xqa_07_binds_flashinfers_kernel_variant_and_its_fp8_rule(monkeypatch):
    """FlashInfer 0.7: the entry is ``get_xqa_module(<variant>, q_seq_len=1, ragged=False).xqa``, and
    the SM90 fp8 kernel serves head dims up to 256 only (0.7.2 xqa.py); 0.5's rule has no bound."""
    import sys
    from types import ModuleType, SimpleNamespace
    variants = []
    fake = ModuleType("flashinfer.xqa")
    fake.get_xqa_module = lambda *variant: variants.append(variant) or SimpleNamespace(xqa="entry")
    monkeypatch.setitem(sys.modules, "flashinfer.xqa", fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(multi_processor_count=132))
    from dispatch.benchmark.vendors import make_problem
    ws = torch.zeros(16 << 20, dtype=torch.uint8)
    for head_dim, fp8_kernel in ((128, True), (512, False)):
        p = make_problem(entry="xqa_batch_decode_with_kv_cache", phase="decode", num_qo_heads=8, num_kv_heads=2,
                         head_dim_qk=head_dim, head_dim_vo=head_dim, page_size=16, window_left=7, device_type="cuda")
        x = XqaBackend.bind_direct(p, torch.bfloat16, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu"), ws, "0.7")
        assert x.run == "entry" and x.abi == "0.7" and x.fp8_sm90 is fp8_kernel and x.sliding_window == 8
        assert variants[-1] == (torch.bfloat16, torch.float8_e4m3fn, 16, head_dim, 4, True, torch.bfloat16, 1, False)
