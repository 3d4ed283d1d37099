"""fa2 / fa3 through FlashInfer 0.7's wrappers (every path fast): the first run after a
plan is FlashInfer's own run() with its compiled op's arguments recorded; later runs, and the
launcher of repeats, call the op with those arguments and the call's own tensors (what FlashInfer's
run() passes for them), so a call pays no FlashInfer Python layer. A run that hands the op anything
made for that one call (a cast q, a fresh buffer) keeps the public run; so does an unread version."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from backends._fi_prefill import FiState, FlashInferPrefill

ALIBI = {}


def alibi_slopes(heads: int, device) -> torch.Tensor:
    """FlashInfer's cached ALiBi slopes (utils.py _get_cache_alibi_slopes_buf): one tensor per key."""
    return ALIBI.setdefault((heads, str(device)), torch.randn(heads))


class Fake07Wrapper:
    """The shape of FlashInfer 0.7.2's wrappers' run(): checks, then one call of the compiled op
    with plan-time attributes and the call's q, k, v, out, lse (prefill.py run_args)."""

    def __init__(self, paged: bool, cast_q: bool = False, fresh_buffer: bool = False):
        self.paged, self.cast_q, self.fresh_buffer, self.public_runs, self.ops = paged, cast_q, fresh_buffer, 0, []
        record = lambda name: (lambda *args: self.ops.append((name, args)))  # noqa: E731
        self._cached_module = SimpleNamespace(paged_run=record("paged_run"), ragged_run=record("ragged_run"))
        self._jit_module, self._backend, self._prefix_len_ptr, self._plan_info = None, "fa2", None, [1, 2]
        self._float_workspace_buffer, self._int_workspace_buffer = torch.empty(8), torch.empty(8)
        self._qo_indptr_buf, self._kv_indptr_buf = torch.tensor([0, 2]), torch.tensor([0, 3])

    def plan(self, *args, sm_scale=None, **kwargs) -> None:
        self._sm_scale, self._plan_info = sm_scale, [len(self.ops), 2]

    def run(self, q, *kv, out=None, lse=None, return_lse=False, kv_cache_sf=None):
        self.public_runs += 1
        self.scale_factors = kv_cache_sf
        k, v = kv[0] if self.paged else kv
        q = q.double() if self.cast_q else q
        scratch = torch.empty(2) if self.fresh_buffer else None
        args = [self._float_workspace_buffer, self._int_workspace_buffer, self._plan_info, q, k, v,
                self._qo_indptr_buf, self._kv_indptr_buf, out, lse, 1, 0, -1, True, scratch,
                alibi_slopes(q.shape[1], q.device), 0.0, self._sm_scale, *(kv_cache_sf or ())]
        getattr(self._cached_module, "paged_run" if self.paged else "ragged_run")(*args)
        return (out, lse) if return_lse else out


def provider_at(monkeypatch, version: str) -> FlashInferPrefill:
    provider = FlashInferPrefill("fa2")
    monkeypatch.setattr(provider, "version", lambda: version)
    monkeypatch.setattr(provider, "loaded", lambda: SimpleNamespace(
        module=SimpleNamespace(_get_cache_alibi_slopes_buf=alibi_slopes)))
    return provider


def call(with_lse: bool = True) -> SimpleNamespace:
    q = torch.randn(2, 4, 8)
    return SimpleNamespace(q=q, k=torch.randn(3, 2, 8), v=torch.randn(3, 2, 8), out=torch.full_like(q, float("nan")),
                           lse=torch.full((2, 4), float("nan")) if with_lse else None, sm_scale=0.3, out_scale=1.0,
                           k_sf=None, v_sf=None)


def planned(provider, wrapper) -> FiState:
    state = FiState(wrapper, (None,) * 5, {"sm_scale": 0.3}, wrapper.paged)
    provider._apply_plan(state)
    return state


def same_arguments(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


PROBLEM = SimpleNamespace(kv_layout="NHD")


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("with_lse", [True, False])
def test_later_runs_call_the_op_with_what_flashinfers_run_passes(monkeypatch, paged, with_lse):
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(paged)
    state = planned(provider, wrapper)
    assert state.record and state.direct is None
    provider.run(PROBLEM, state, call(with_lse))
    assert wrapper.public_runs == 1 and state.direct is not None
    second = call(with_lse)
    provider.run(PROBLEM, state, second)
    assert wrapper.public_runs == 1  # the op, not FlashInfer's Python run
    direct = wrapper.ops[-1]
    kv = ((second.k, second.v),) if paged else (second.k, second.v)
    wrapper.run(second.q, *kv, out=second.out, lse=second.lse, return_lse=with_lse)
    assert direct[0] == wrapper.ops[-1][0] and same_arguments(direct[1], wrapper.ops[-1][1])
    third = call(with_lse)
    provider.launcher(PROBLEM, state, third)(third)  # a lane's repeats: the launcher calls the op too
    assert wrapper.public_runs == 2 and wrapper.ops[-1][1][3] is third.q and wrapper.ops[-1][1][8] is third.out


def test_a_new_plan_records_again(monkeypatch):
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(True)
    state = planned(provider, wrapper)
    provider.run(PROBLEM, state, call())
    provider._apply_plan(state)  # another plan used the wrapper: its plan info is new
    assert state.direct is None and state.record
    provider.run(PROBLEM, state, call())
    provider.run(PROBLEM, state, call())
    assert wrapper.public_runs == 2 and wrapper.ops[-1][1][2] is wrapper._plan_info


@pytest.mark.parametrize("made_per_call", ["cast_q", "fresh_buffer"])
def test_a_run_that_makes_an_argument_for_the_call_stays_public(monkeypatch, made_per_call):
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(True, **{made_per_call: True})
    state = planned(provider, wrapper)
    for _ in range(3):
        provider.run(PROBLEM, state, call())
    assert state.direct is None and wrapper.public_runs == 3


@pytest.mark.parametrize("version", ["0.6.14", "0.8.0", None])
def test_a_version_whose_run_was_not_read_stays_public(monkeypatch, version):
    provider, wrapper = provider_at(monkeypatch, version), Fake07Wrapper(True)
    state = planned(provider, wrapper)
    for _ in range(3):
        provider.run(PROBLEM, state, call())
    assert not state.record and state.direct is None and wrapper.public_runs == 3


def test_a_failed_public_run_leaves_flashinfers_module_in_place(monkeypatch):
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(True)
    module = wrapper._cached_module
    state = planned(provider, wrapper)
    monkeypatch.setattr(module, "paged_run", lambda *args: (_ for _ in ()).throw(RuntimeError("kernel failed")))
    with pytest.raises(RuntimeError, match="kernel failed"):
        provider.run(PROBLEM, state, call())
    assert wrapper._cached_module is module and state.direct is None


@pytest.mark.parametrize("version", ["0.7.2", "0.5.3"])
def test_a_device_scale_is_read_on_every_run(monkeypatch, version):
    """run(q, kv, k_scale=<tensor>) folds a device scale: the plan's float would ignore it. Each run
    reads it (as plan() does) and re-plans when it differs, the recorded op included."""
    provider, wrapper = provider_at(monkeypatch, version), Fake07Wrapper(True)
    state = planned(provider, wrapper)
    for value in (0.3, 0.15, 0.15, 0.6):
        batch = call()
        batch.sm_scale = torch.tensor(value)
        provider.run(PROBLEM, state, batch)
        assert wrapper._sm_scale == pytest.approx(value) and state.plan_kwargs["sm_scale"] == pytest.approx(value)
    assert [a[-1] for _, a in wrapper.ops] == pytest.approx([0.3, 0.15, 0.15, 0.6])
    assert provider.launcher(PROBLEM, state, batch) is None  # the value is not in a lane's key


def test_a_device_scale_inside_a_capture_is_handed_on(monkeypatch):
    """Reading a device scale inside a CUDA-graph capture would break it: refused before launch."""
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(True)
    state = planned(provider, wrapper)
    batch = call()
    batch.sm_scale = SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setattr(torch, "Tensor", SimpleNamespace)  # the stand-in scale counts as a tensor
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    from backends._vendor import BackendRejected
    with pytest.raises(BackendRejected, match="sm_scale"):
        provider.run(PROBLEM, state, batch)
    assert wrapper.ops == []


@pytest.mark.parametrize("paged,layout", [(True, "NHD"), (True, "HND"), (False, "NHD")])
def test_nvfp4_scale_factors_go_with_every_run_in_the_caches_layout(monkeypatch, paged, layout):
    """An NVFP4 cache: FlashInfer's run() takes the call's scale factors (kv_cache_sf, uint8 bytes in the
    cache's physical layout: our logical NHD views transposed back for HND), on every run; no op that
    took one call's scale factors is kept for the next."""
    provider, wrapper = provider_at(monkeypatch, "0.7.2"), Fake07Wrapper(paged)
    state = planned(provider, wrapper)
    problem = SimpleNamespace(kv_layout=layout if paged else "NHD")
    for _ in range(3):
        batch = call()
        pages = (3, 2, 4) if paged else (3, 2)  # (pages, page, heads) logical NHD views, or (tokens, heads)
        batch.k, batch.v = (torch.randint(0, 255, (*pages, 4), dtype=torch.uint8) for _ in range(2))
        batch.k_sf, batch.v_sf = (torch.randn(*pages, 1).to(torch.float8_e4m3fn) for _ in range(2))
        provider.run(problem, state, batch)
        k_sf, v_sf = wrapper.scale_factors
        want = [t.permute(0, 2, 1, 3) if paged and layout == "HND" else t for t in (batch.k_sf, batch.v_sf)]
        assert k_sf.dtype == v_sf.dtype == torch.uint8
        assert [t.data_ptr() for t in (k_sf, v_sf)] == [t.data_ptr() for t in want]
        assert [t.shape for t in (k_sf, v_sf)] == [t.shape for t in want]
    assert wrapper.public_runs == 3 and state.direct is None
