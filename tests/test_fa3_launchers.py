"""fa3 through FlashInfer 0.5.3's wrappers takes the compiled run, as fa2 does (every path fast): the
arguments it passes are those FlashInfer 0.5.3's own wrapper run() passes for the same
plan (flashinfer/prefill.py: BatchPrefillWith{Paged,Ragged}KVCacheWrapper.run), the paged run turns
the page indices into token offsets for the call's K strides on every call (as FlashInfer's does), and
repeats take the launcher, never the wrapper's Python run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import _fake_vendors as fv
from backends import _vendor
from backends._fi_prefill import FiState, FlashInferPrefill


@pytest.fixture
def fake_flashinfer(monkeypatch):
    mods = fv.install_flashinfer(monkeypatch, fv.Recorder())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    yield mods["flashinfer.prefill"]
    _vendor.forget_imports()


def _wrapper(kind: str, paged: bool, layout: str, calls: list):
    """A FlashInfer 0.5.3 wrapper's attributes after plan() (flashinfer/prefill.py)."""
    def record(name):
        return lambda *args: calls.append((name, args))
    w = SimpleNamespace(
        _jit_module=None, _prefix_len_ptr=None, _backend=kind, _plan_info=[1, 2], _custom_mask_buf=None,
        _causal=True, _float_workspace_buffer=torch.empty(8), _int_workspace_buffer=torch.empty(8),
        _kv_layout=layout, _window_left=-1, _mask_indptr_buf=None, _token_pos_in_items_ptr=None,
        _max_item_len_ptr=None, _logits_soft_cap=None, _rope_scale=None, _rope_theta=None,
        _token_pos_in_items_len=0, _qo_indptr_buf=torch.tensor([0, 1]), _kv_indptr_buf=torch.tensor([0, 4]),
        _cached_module=SimpleNamespace(paged_run=record("paged_run"), ragged_run=record("ragged_run")))
    if paged:
        w.__dict__.update(_num_qo_heads=4, _num_kv_heads=2, _paged_kv_indptr_buf=torch.tensor([0, 1]),
                          _paged_kv_indices_buf=torch.tensor([0]), _paged_kv_last_page_len_buf=torch.tensor([4]),
                          _workspace_size=8, _block_tables=None, _kv_lens_buffer=torch.tensor([4]), _max_q_len=1,
                          _max_kv_len=4, _batch_size=1, _vector_sparse_indptr_buffer=torch.zeros(2, dtype=torch.int32),
                          _vector_sparse_indices_buffer=torch.zeros(16, dtype=torch.int32))
    return w


def _conversions(prefill, calls: list):
    """FlashInfer 0.5.3's block_sparse_indices_to_vector_sparse_offsets, recording its arguments."""
    def convert(blocks, block_indptr, offsets, offsets_indptr, lens, stride_block, stride_n, block_size):
        calls.append(("convert", (blocks, block_indptr, offsets, offsets_indptr, lens, stride_block, stride_n,
                                  block_size)))
        return offsets
    prefill.block_sparse_indices_to_vector_sparse_offsets = convert


def test_fa3_ragged_compiled_run_takes_flashinfers_argument_list(fake_flashinfer):
    calls: list = []
    w = _wrapper("fa3", False, "NHD", calls)
    state = FiState(w, (None, None, 4, 2, 16), {"sm_scale": 0.3}, False)
    direct = FlashInferPrefill("fa3")._direct_run(state)
    assert direct is not None and direct.sparse is None
    q, k, v, out, lse = (torch.randn(2) for _ in range(5))
    direct(q, k, v, out, lse)
    name, args = calls[-1]
    # FlashInfer 0.5.3 ragged run(): run_args, then the 11 non-JIT extras (25 in all)
    expected = [w._float_workspace_buffer, w._int_workspace_buffer, w._plan_info, q, k, v, w._qo_indptr_buf,
                w._kv_indptr_buf, out, lse]
    assert name == "ragged_run" and len(args) == 25
    assert all(a is b for a, b in zip(args[:10], expected))
    assert args[10:14] == (1, 0, -1, True)  # causal mask mode, NHD, no window, PDL on sm_90
    assert args[20:] == (0.0, 0.3, 1.0, 1e4, 0)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fa3_paged_compiled_run_converts_pages_per_call(fake_flashinfer, layout):
    """Slots 7 and 8 are the vector-sparse indptr and the offsets converted for this call's K (page
    stride over token stride), as FlashInfer 0.5.3's paged run() passes them for fa3."""
    calls: list = []
    _conversions(fake_flashinfer, calls)
    w = _wrapper("fa3", True, layout, calls)
    state = FiState(w, (None,) * 4 + (4, 2, 16, 16), {"sm_scale": 0.3}, True)
    direct = FlashInferPrefill("fa3")._direct_run(state)
    assert direct is not None and direct.sparse is not None
    pool = torch.randn(3, 16, 2, 16) if layout == "NHD" else torch.randn(3, 2, 16, 16)
    q, out, lse = torch.randn(2), torch.randn(2), torch.randn(2)
    for _ in range(2):  # every call converts, as FlashInfer's run does
        direct(q, pool, pool, out, lse)
    names = [n for n, _ in calls]
    assert names == ["convert", "paged_run", "convert", "paged_run"]
    conv = calls[0][1]
    token = 1 if layout == "NHD" else 2
    assert conv[0] is w._paged_kv_indices_buf and conv[1] is w._paged_kv_indptr_buf
    assert conv[2] is w._vector_sparse_indices_buffer and conv[3] is w._vector_sparse_indptr_buffer
    assert conv[4] is w._kv_lens_buffer and conv[5:] == (pool.stride(0) // pool.stride(token), 1, 16)
    args = calls[-1][1]
    assert len(args) == 42 and args[7] is w._vector_sparse_indptr_buffer and args[8] is w._vector_sparse_indices_buffer
    assert args[3] is q and args[4] is pool and args[10] is out and args[11] is lse and args[23] == 0.3


def test_fa3_launcher_calls_the_compiled_run_not_the_wrapper(fake_flashinfer, monkeypatch):
    calls: list = []
    provider = FlashInferPrefill("fa3")
    w = _wrapper("fa3", False, "NHD", calls)
    state = FiState(w, (None, None, 4, 2, 16), {"sm_scale": 0.3}, False)
    state.direct = provider._direct_run(state)
    state.held.last = state  # the wrapper's last plan
    monkeypatch.setattr(provider, "run", lambda *a: pytest.fail("the wrapper's run served a repeat"))
    batch = SimpleNamespace(q=torch.randn(2), k=torch.randn(2), v=torch.randn(2), out=torch.randn(2), lse=None,
                            sm_scale=0.3, out_scale=1.0)
    launch = provider.launcher(SimpleNamespace(kv_layout="NHD"), state, batch)
    assert launch is not None
    launch(batch)
    assert calls[-1][0] == "ragged_run" and calls[-1][1][3] is batch.q


def test_another_kinds_wrapper_gets_no_compiled_run(fake_flashinfer):
    """A wrapper planned for fa2 never takes fa3's compiled run (nor the reverse)."""
    w = _wrapper("fa2", False, "NHD", [])
    state = FiState(w, (None, None, 4, 2, 16), {"sm_scale": 0.3}, False)
    assert FlashInferPrefill("fa3")._direct_run(state) is None
