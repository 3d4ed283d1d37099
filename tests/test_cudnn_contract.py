"""cuDNN adapter contract, without a GPU and without nvidia-cudnn-frontend.

A fake ``cudnn`` module (injected through sys.modules) records the graph the
adapter declares and *executes it the way cuDNN would read it*: every operand is
addressed only through its declared dims / strides / ragged offsets / page table
(as_strided on the bound buffer), attention is computed in fp64 with the declared
masks, O and natural-log Stats are written back the same way. Comparing the
adapter's final out / lse with the fp64 oracle therefore checks the translation
(layouts, element offsets, page tables, masks, LSE base and layout, scales).
"""
from __future__ import annotations

import ctypes
import math
import sys
import types

import pytest
import torch

from backends import BackendRejected
from backends import cudnn as adapter
from capability_db import resolve_device
from dispatch.benchmark.probe import BASE, Case, make_batch, oracle, rel_error
from dataclasses import replace

CPU = torch.device("cpu")
H100 = resolve_device("h100")


class FakeNotSupported(Exception):
    pass


class FakeTensor:
    def __init__(self, name="", dim=(), stride=(), data_type=None, uid=None, **_):
        self.name, self.dim, self.stride, self.data_type, self.uid = name, tuple(dim), tuple(stride), data_type, uid
        self.ragged, self.output = None, False

    def set_ragged_offset(self, t):
        self.ragged = t
        return self

    def set_output(self, v):
        self.output = v
        return self

    def set_dim(self, d):
        self.dim = tuple(d)
        return self

    def set_stride(self, s):
        self.stride = tuple(s)
        return self

    def set_data_type(self, t):
        self.data_type = t
        return self

    def set_uid(self, u):
        self.uid = u
        return self


DTYPES = {"HALF": torch.float16, "BFLOAT16": torch.bfloat16, "FLOAT": torch.float32, "INT32": torch.int32}


def memory_at(ptr: int, data_type) -> torch.Tensor:
    """What cuDNN gets for a buffer: an address. The memory there, typed as declared (never read
    past what the declared layout addresses: the bound is not an allocation)."""
    return torch.frombuffer((ctypes.c_byte * (1 << 40)).from_address(ptr), dtype=DTYPES[data_type])


def _view(mem: torch.Tensor, t: FakeTensor, b: int, mems, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of request b of a declared (B, H, S, D) operand, addressed as cuDNN would."""
    assert rows <= t.dim[2], "the declared max length must cover the request"
    offset = int(mems[t.ragged.uid][b]) if t.ragged is not None else b * t.stride[0]
    return mem.as_strided((t.dim[1], rows, t.dim[3]), t.stride[1:], offset)


def _paged(mem, t: FakeTensor, table_t: FakeTensor, table, b: int, n: int) -> torch.Tensor:
    """(H, n, D) keys of request b gathered through the page table of the declared pool."""
    pool = mem.as_strided(t.dim, t.stride, 0)
    P, width = t.dim[2], table_t.dim[2]
    pages = table.as_strided((width,), (table_t.stride[2],), b * table_t.stride[0])[: math.ceil(n / P)].long()
    return torch.cat([pool[p] for p in pages], dim=1)[:, :n]


class FakeGraph:
    """cudnn-frontend before 1.22: ``execute`` takes a uid (or tensor) -> buffer map. Whatever the
    frontend, the fake reads only each buffer's address, through the graph's declaration."""

    built = 0

    def __init__(self, module, **kwargs):
        self.module, self.kwargs, self.sdpa_kwargs, self.declared = module, kwargs, None, {}
        module.graphs.append(self)

    def tensor(self, **kw):
        t = FakeTensor(**kw)
        self.declared[t.uid] = t
        return t

    def sdpa(self, name, q, k, v, **kw):
        self.q, self.k, self.v, self.sdpa_kwargs = q, k, v, kw
        self.o, self.stats = FakeTensor(name="O"), FakeTensor(name="Stats") if kw.get("generate_stats") else None
        return [self.o, self.stats]

    def validate(self, *args):
        pass

    build_operation_graph = create_execution_plans = validate

    def check_support(self):
        if self.module.refuse:
            raise FakeNotSupported("cudnnGraphNotSupportedError: no engine")
        kw = self.sdpa_kwargs or {}
        if "paged_attention_k_table" in kw:  # cuDNN 9.19 declines a table of another width (H200)
            page = self.k.dim[2]
            for table in (kw["paged_attention_k_table"], kw["paged_attention_v_table"]):
                if table.dim[2] != -(-kw["paged_attention_max_seq_len_kv"] // page):
                    raise FakeNotSupported("block table size must equal ceil(s_kv/block_size)")

    def build_plans(self):
        FakeGraph.built += 1
        for t in (self.o, self.stats):
            if t is not None:
                self.declared[t.uid] = t

    def get_workspace_size(self):
        return 4096

    def user_uids(self) -> list:
        """The uids the graph reads a buffer for, ascending (a float attn_scale is passed by value)."""
        return sorted(u for u in self.declared if u is not None)

    def execute(self, pack, workspace, handle=None):
        assert workspace.numel() >= 4096
        self._run({(k if isinstance(k, int) else k.uid): v.data_ptr() for k, v in pack.items()}, "map")

    def _run(self, pointers: dict, how: str):
        assert sorted(pointers) == self.user_uids(), "every declared buffer, nothing else"
        self.module.executions.append(pointers)
        self.module.calls.append(how)
        mems = {uid: memory_at(ptr, self.declared[uid].data_type) for uid, ptr in pointers.items()}
        operands = {t.uid for t in (self.q, self.k, self.v, self.o, self.stats) if t is not None}
        self.module.reads.append({uid: mems[uid][: math.prod(self.declared[uid].dim)].clone()
                                  for uid in pointers if uid not in operands})  # metadata, as read at launch
        for b in range(self.q.dim[0]):
            self._request(mems, self.sdpa_kwargs, b)

    def _request(self, mems, kw, b):
        lq, lk = int(mems[kw["seq_len_q"].uid][b]), int(mems[kw["seq_len_kv"].uid][b])
        q = _view(mems[self.q.uid], self.q, b, mems, lq).double()
        if "paged_attention_k_table" in kw:
            tk, tv = kw["paged_attention_k_table"], kw["paged_attention_v_table"]
            k = _paged(mems[self.k.uid], self.k, tk, mems[tk.uid], b, lk).double()
            v = _paged(mems[self.v.uid], self.v, tv, mems[tv.uid], b, lk).double()
        else:
            k = _view(mems[self.k.uid], self.k, b, mems, lk).double()
            v = _view(mems[self.v.uid], self.v, b, mems, lk).double()
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scale = kw["attn_scale"]
        scale = float(mems[scale.uid][0]) if isinstance(scale, FakeTensor) else scale
        s = torch.einsum("hqd,hkd->hqk", q, k) * scale
        pos = torch.arange(lq)[:, None] + lk - lq
        key = torch.arange(lk)[None, :]
        if kw.get("use_causal_mask_bottom_right") or kw.get("diagonal_band_right_bound") == 0:
            s = s.masked_fill(key > pos, float("-inf"))
        if kw.get("diagonal_band_left_bound") is not None:
            s = s.masked_fill(key <= pos - kw["diagonal_band_left_bound"], float("-inf"))
        sinks = mems[kw["sink_token"].uid][: q.shape[0]] if "sink_token" in kw else None
        parts = [s] + ([sinks.double().reshape(-1, 1, 1).expand(-1, lq, 1)] if sinks is not None else [])
        lse = torch.logsumexp(torch.cat(parts, -1), -1)
        o = torch.einsum("hqk,hkd->hqd", torch.exp(s - lse[..., None]), v)
        _view(mems[self.o.uid], self.o, b, mems, lq).copy_(o)
        if self.stats is not None:
            _view(mems[self.stats.uid], self.stats, b, mems, lq)[..., 0].copy_(lse)


class FakePointerGraph(FakeGraph):
    """cudnn-frontend 1.22.0 - 1.23.0: pointers in the graph's ascending uid order (_execute_with_ptrs)."""

    def _prepare_variant_pack_template(self):
        self.prepared = True

    def _get_variant_pack_uids_sorted(self):
        return self.user_uids() if getattr(self, "prepared", False) else []

    def _execute_with_ptrs(self, ptrs, workspace, handle):
        assert all(type(p) is int for p in ptrs) and type(workspace) is int and workspace != 0
        self._run(dict(zip(self.user_uids(), ptrs)), "pointers")


class FakeOrderedGraph(FakeGraph):
    """cudnn-frontend 1.32: ``execute(buffers, workspace, handle, tensor_uids=...)``."""

    def execute(self, pack, workspace=None, handle=None, override_uids=None, override_shapes=None,
                override_strides=None, tensor_uids=None):
        if tensor_uids is None:
            return super().execute(pack, workspace, handle)
        assert workspace.numel() >= 4096 and len(set(tensor_uids)) == len(tensor_uids) == len(pack)
        self._run({uid: t.data_ptr() for uid, t in zip(tensor_uids, pack)}, "ordered")


class FakeRawGraph(FakeOrderedGraph):
    """cudnn-frontend 1.32's internals: a lowered C++ graph whose ``_execute_with_raw_ptrs`` takes a
    ``void*[]`` in ascending uid order (what ``execute`` ends in for the cuDNN backend)."""

    selected_engine, _plans, _plan_index = None, [], 0

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self._lowered_graph = types.SimpleNamespace(_execute_with_raw_ptrs=self._raw)

    def _variant_pack_uids(self):
        return self.user_uids()

    def _raw(self, address, count, workspace, backend_handle, index):
        assert type(workspace) is int and workspace != 0 and backend_handle == 7 and index == -1
        pointers = (ctypes.c_void_p * count).from_address(address)
        self._run(dict(zip(self.user_uids(), (p or 0 for p in pointers))), "raw")


FRONTENDS = {"map": FakeGraph, "pointers": FakePointerGraph, "ordered": FakeOrderedGraph, "raw": FakeRawGraph}


def make_fake_cudnn(backend_version=91900, refuse=False, frontend="ordered") -> types.ModuleType:
    m = types.ModuleType("cudnn")
    m.graphs, m.executions, m.reads, m.calls, m.streams, m.refuse = [], [], [], [], [], refuse
    m.data_type = types.SimpleNamespace(HALF="HALF", BFLOAT16="BFLOAT16", FLOAT="FLOAT", INT32="INT32")
    m.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    m.diagonal_alignment = types.SimpleNamespace(BOTTOM_RIGHT="BOTTOM_RIGHT", TOP_LEFT="TOP_LEFT")
    m.cudnnGraphNotSupportedError = FakeNotSupported
    m.pygraph = lambda **kw: FRONTENDS[frontend](m, **kw)
    m.backend_version = lambda: backend_version
    m.backend_version_string = lambda: str(backend_version)
    m.create_handle = lambda: types.SimpleNamespace(backend_handle=7)
    m.set_stream = lambda handle, stream: m.streams.append((handle, stream))
    m.__version__ = {"raw": "1.32.0", "pointers": "1.23.0"}.get(frontend, "fake")  # the pinned private paths
    return m


@pytest.fixture
def fake(monkeypatch):
    module = make_fake_cudnn()
    monkeypatch.setitem(sys.modules, "cudnn", module)
    return module


def fp32_case(name="c", lens=((7, 33, 2), (47, 33, 72)), **changes) -> Case:
    problem = replace(BASE, q_dtype="float32", kv_dtype="float32", out_dtype="float32", device_type="cpu", **changes)
    return Case(name, problem, *lens)


def run_adapter(case: Case, seed=0):
    backend = adapter.CudnnBackend()
    batch = make_batch(case, CPU, seed=seed)
    plan = backend.plan(case.problem, batch)
    backend.run(plan, batch)
    return backend, batch, plan


# ------------------------------------------------------------------- absent
def test_absent_module_is_a_not_installed_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import raises ModuleNotFoundError
    reason = adapter.CudnnBackend().available()
    assert reason is not None and reason.value == "not installed" and "attn-dispatch[cudnn]" in reason.allowed
    assert adapter.CudnnBackend().extra_checks(BASE, H100) == []


def test_absent_module_shows_in_router_reasons(monkeypatch):
    import backends
    from dispatch.router import backend_reasons

    monkeypatch.setitem(sys.modules, "cudnn", None)
    monkeypatch.setitem(backends._INSTANCES, "cudnn", adapter.CudnnBackend())
    reasons = backend_reasons("cudnn", BASE, H100, live=True)
    assert [r.value for r in reasons][:1] == ["not installed"]


# -------------------------------------------------------- numerical translation
SCENARIOS = {
    "prefill_paged_nhd": {},
    "prefill_paged_hnd": dict(kv_layout="HND"),
    "prefill_paged_page8_mha": dict(page_size=8, num_kv_heads=8),
    "prefill_ragged": dict(kv_storage="ragged", page_size=0),
    "prefill_noncausal": dict(causal=False),
    "prefill_window5": dict(window_left=5),
    "prefill_sinks": dict(has_sinks=True),
    "prefill_d64_192_128": dict(head_dim_qk=192, head_dim_vo=128),
    "decode_paged": dict(phase="decode", _lens=((1, 1, 1), (40, 3, 129))),
    "decode_ragged_window": dict(phase="decode", kv_storage="ragged", page_size=0, window_left=7, _lens=((1, 1), (20, 9))),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_translation_matches_fp64_oracle(fake, name):
    changes = dict(SCENARIOS[name])
    lens = changes.pop("_lens", ((7, 33, 2), (47, 33, 72)))
    case = fp32_case(name, lens, **changes)
    _, batch, _ = run_adapter(case, seed=len(name))
    ref_out, ref_lse = oracle(case.problem, batch)
    assert not torch.isnan(batch.out).any() and not torch.isnan(batch.lse).any()  # every element written
    assert rel_error(batch.out, ref_out) < 1e-5
    assert rel_error(batch.lse, ref_lse) < 1e-5  # natural log -> base 2, (B,H,S,1) -> (total_q, H)


def test_scales_tensor_and_out_scale(fake):
    case = replace(fp32_case("scales"), out_scale=0.5, tensor_scales=True)
    backend, batch, plan = run_adapter(case, seed=3)
    ref_out, ref_lse = oracle(case.problem, batch)
    assert plan.key.scale is None and adapter.UID_SCALE in fake.executions[-1]
    assert rel_error(batch.out, ref_out) < 1e-5 and rel_error(batch.lse, ref_lse) < 1e-5


def test_non_contiguous_q_uses_its_token_stride(fake):
    case = fp32_case("strided")
    batch = make_batch(case, CPU, seed=5)
    wide = torch.randn(batch.q.shape[0], batch.q.shape[1], 3 * batch.q.shape[2])
    wide[:, :, : batch.q.shape[2]] = batch.q
    batch.q = wide[:, :, : batch.q.shape[2]]  # token stride 3*H*D, head stride 3*D
    backend = adapter.CudnnBackend()
    plan = backend.plan(case.problem, batch)
    backend.run(plan, batch)
    assert torch.equal(plan.inputs[adapter.UID_OFF_Q].reshape(-1), batch.qo_indptr * batch.q.stride(0))
    assert rel_error(batch.out, oracle(case.problem, batch)[0]) < 1e-5


# ------------------------------------------------------------- what is declared
def test_declared_graph_offsets_tables_and_buckets(fake):
    case = fp32_case("declared")
    _, batch, plan = run_adapter(case)
    g = fake.graphs[-1]
    H, D = case.problem.num_qo_heads, case.problem.head_dim_qk
    assert g.q.dim == (3, H, 64, D) and g.q.stride[1:] == (D, H * D, 1)  # max_q 33 -> bucket 64
    offsets = plan.inputs[adapter.UID_OFF_Q].reshape(-1)
    assert offsets.tolist() == [t * H * D for t in batch.qo_indptr.tolist()]  # elements, not tokens
    assert plan.inputs[adapter.UID_OFF_STATS].reshape(-1).tolist() == [t * H for t in batch.qo_indptr.tolist()]
    assert g.stats.dim == (3, H, 64, 1)
    table = plan.inputs[adapter.UID_TABLE_K]  # read through its declaration: (B, 1, width, 1), row-major
    # S_kv: the bucket of the longest request (72 keys -> 128); cuDNN reads a table exactly ceil(S_kv /
    # page_size) wide (9.19 declines another): the 5 pages padded to 8
    width = batch.block_table.shape[1]
    assert g.sdpa_kwargs["paged_attention_max_seq_len_kv"] == 128 and case.problem.page_size == 16 and width == 5
    assert fake.graphs[-1].declared[adapter.UID_TABLE_K].dim == (3, 1, 8, 1)
    assert table.dtype == torch.int32 and table.is_contiguous() and table.shape == (3, 8)
    assert torch.equal(table[:, :width], batch.block_table) and not table[:, width:].any()
    assert g.sdpa_kwargs["use_causal_mask_bottom_right"] is True and g.sdpa_kwargs["use_padding_mask"] is True


def test_an_engine_wide_page_table_is_cut_to_the_batchs_keys(fake):
    """An engine's table is as wide as its longest context; the graph's S_kv follows the batch, and the
    table goes over cut to S_kv's pages (cuDNN reads exactly that many; the rest are never read)."""
    case = fp32_case("declared")
    batch = make_batch(case, CPU)
    width = batch.block_table.shape[1]
    wide = torch.full((batch.batch_size, 64), 10 ** 6, dtype=batch.block_table.dtype)  # never read
    wide[:, :width] = batch.block_table
    batch = replace(batch, block_table=wide)
    backend = adapter.CudnnBackend()
    plan = backend.plan(case.problem, batch)
    backend.run(plan, batch)
    assert fake.graphs[-1].sdpa_kwargs["paged_attention_max_seq_len_kv"] == 128
    assert plan.inputs[adapter.UID_TABLE_K].shape == (batch.batch_size, 8)
    assert rel_error(batch.out, oracle(case.problem, batch)[0]) < 1e-5


def test_v_pages_with_ids_of_their_own_go_through_cudnns_v_table(fake):
    """uses_shared_paged_kv_idx=False (the trtllm entry's separate K/V page ids): K's table to cuDNN's K
    table input, V's to its V table input; V's pages moved to other ids give the oracle's result, on
    the first call and on an exact repeat's launcher."""
    case = fp32_case("declared")
    problem = replace(case.problem, uses_shared_paged_kv_idx=False)
    batch = make_batch(case, CPU)
    moved = torch.randperm(batch.v.shape[0], generator=torch.Generator().manual_seed(3))
    v = batch.v.clone()
    v[moved] = batch.v
    batch = replace(batch, v=v, v_block_table=moved[batch.block_table.long()].to(torch.int32))
    backend = adapter.CudnnBackend()
    assert "uses_shared_paged_kv_idx" not in [r.field for r in backend.check(problem, H100)]
    plan = backend.plan(problem, batch)
    backend.run(plan, batch)
    want = oracle(problem, batch)[0]
    assert rel_error(batch.out, want) < 1e-5
    assert torch.equal(plan.inputs[adapter.UID_TABLE_V][:, : batch.v_block_table.shape[1]], batch.v_block_table)
    batch.out.fill_(float("nan"))
    backend.launcher(plan, batch)(batch)
    assert rel_error(batch.out, want) < 1e-5


def test_window_is_a_left_band_of_w_plus_one(fake):
    run_adapter(fp32_case("w", window_left=5))
    kw = fake.graphs[-1].sdpa_kwargs
    assert kw["diagonal_band_left_bound"] == 6 and kw["diagonal_band_right_bound"] == 0
    assert "use_causal_mask_bottom_right" not in kw


def test_bucket():
    assert [adapter.bucket(n) for n in (1, 2, 16, 17, 33, 4096, 4097)] == [1, 16, 16, 32, 64, 4096, 8192]


# -------------------------------------------------------------- graph cache
def test_same_bucket_reuses_the_graph(fake):
    backend = adapter.CudnnBackend()
    first = make_batch(fp32_case("a", ((7, 33, 2), (47, 33, 72))), CPU, seed=1)
    second = make_batch(fp32_case("b", ((9, 40, 4), (40, 40, 70))), CPU, seed=2)  # same pool and table width
    problem = fp32_case().problem
    plan1, plan2 = backend.plan(problem, first), backend.plan(problem, second)
    assert len(fake.graphs) == 1 and plan1.entry is plan2.entry  # lengths are runtime inputs
    backend.run(plan2, second)
    assert rel_error(second.out, oracle(problem, second)[0]) < 1e-5


def test_new_bucket_or_float_scale_builds_a_new_graph(fake):
    backend = adapter.CudnnBackend()
    problem = fp32_case().problem
    base = make_batch(fp32_case("a"), CPU, seed=1)
    longer = make_batch(fp32_case("b", ((70, 3, 2), (80, 33, 72))), CPU, seed=2)  # max_q 70 -> bucket 128
    rescaled = make_batch(fp32_case("a"), CPU, seed=1)
    rescaled.sm_scale = 0.05  # a float scale is a graph constant: a key field
    keys = [backend.plan(problem, b).key for b in (base, longer, rescaled)]
    assert len(set(keys)) == 3 and len(fake.graphs) == 3
    assert keys[1].s_q == 128 and keys[2].scale == 0.05


def test_tensor_scale_values_share_one_graph(fake):
    backend = adapter.CudnnBackend()
    problem = fp32_case().problem
    batches = [make_batch(replace(fp32_case("t"), tensor_scales=True), CPU, seed=s) for s in (1, 2)]
    batches[1].sm_scale = torch.tensor(0.3)
    plans = [backend.plan(problem, b) for b in batches]
    assert len(fake.graphs) == 1 and plans[0].key.scale is None
    backend.run(plans[1], batches[1])
    assert rel_error(batches[1].out, oracle(problem, batches[1])[0]) < 1e-5


def test_a_kept_plan_serves_new_index_values_with_fresh_buffers(fake):
    # The plan is reusable (one per problem): a batch with the same facts but other lengths and
    # offsets gets buffers derived from its own index tensors, on the same graph.
    backend = adapter.CudnnBackend()
    problem = fp32_case().problem
    first = make_batch(fp32_case("a", ((7, 33, 2), (47, 33, 72))), CPU, seed=1)
    second = make_batch(fp32_case("b", ((33, 2, 7), (33, 72, 47))), CPU, seed=2)
    assert backend.plan_reusable(problem) and adapter.batch_facts(first) == adapter.batch_facts(second)
    plan = backend.plan(problem, first)
    second.out.fill_(float("nan"))
    backend.run(plan, second)
    assert len(fake.graphs) == 1
    assert rel_error(second.out, oracle(problem, second)[0]) < 1e-5


def test_static_index_tensors_keep_the_plans_buffers(fake):
    # The wrappers' index tensors are the plan's own (extras static_indices): their buffers are
    # derived once; a run with new q / out reads them as they are.
    backend = adapter.CudnnBackend()
    problem = fp32_case().problem
    first = make_batch(fp32_case("a"), CPU, seed=1)
    plan = backend.plan(problem, first)
    again = replace(first, q=torch.randn_like(first.q), out=torch.full_like(first.out, float("nan")),
                    extras={"static_indices": True})
    backend.run(plan, again)
    assert fake.executions[-1][adapter.UID_OFF_Q] == plan.inputs[adapter.UID_OFF_Q].data_ptr()
    assert rel_error(again.out, oracle(problem, again)[0]) < 1e-5


def test_callers_cudnn_buffers_are_bound_as_given(fake):
    # The cuDNN entry hands over the caller's int32 lengths and element offsets (extras "cudnn"):
    # bound as they are, with the same result as the derived ones.
    backend = adapter.CudnnBackend()
    problem = fp32_case().problem
    plan = backend.plan(problem, make_batch(fp32_case("a"), CPU, seed=1))
    batch = make_batch(fp32_case("a"), CPU, seed=2)
    off_q = (batch.qo_indptr * batch.q.stride(0)).to(torch.int32)
    seq_q = (batch.qo_indptr[1:] - batch.qo_indptr[:-1]).to(torch.int32)
    batch.extras = {"cudnn": {"off_q": off_q, "seq_q": seq_q}}
    batch.out.fill_(float("nan"))
    backend.run(plan, batch)
    pack = fake.executions[-1]
    assert pack[adapter.UID_OFF_Q] == off_q.data_ptr() and pack[adapter.UID_SEQ_Q] == seq_q.data_ptr()
    assert rel_error(batch.out, oracle(problem, batch)[0]) < 1e-5


# ---------------------------------------------------------- refusals, checks
def test_build_failure_is_a_plan_time_rejection(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", make_fake_cudnn(refuse=True))
    case = fp32_case("refused")
    with pytest.raises(BackendRejected) as info:
        adapter.CudnnBackend().plan(case.problem, make_batch(case, CPU))
    assert info.value.reasons[0].field == "cudnn graph" and "no engine" in str(info.value.reasons[0].value)


def test_version_gates_and_dtype_checks(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", make_fake_cudnn(backend_version=90400))
    problem = replace(BASE, kv_dtype="float8_e4m3fn", has_sinks=True)
    fields = {r.field for r in adapter.CudnnBackend().extra_checks(problem, H100)}
    assert {"kv_storage=paged", "has_sinks"} <= fields
    assert "kv_dtype" in {r.field for r in adapter.CudnnBackend().check(problem, H100)}  # data: cudnn.json


@pytest.mark.parametrize("changes,field", [
    (dict(logits_soft_cap=30.0), "has_soft_cap"),
    (dict(causal=False, window_left=4), None),  # measured on H100 / cuDNN 9.19: a version gate, not data
    (dict(phase="decode", has_sinks=True), None),  # the adapter declares two query rows (see graph_key)
    (dict(page_size=12), "page_size"),
    (dict(head_dim_qk=72, head_dim_vo=72), None),
    (dict(head_dim_qk=100, head_dim_vo=100), "head_dim_qk"),
    (dict(pos_encoding="ALIBI"), "pos_encoding"),
])
def test_capability_data(changes, field):
    reasons = adapter.CudnnBackend().caps.check(replace(BASE, **changes), H100)
    assert [r.field for r in reasons][:1] == ([field] if field else [])


def test_one_token_queries_with_sinks_get_two_rows_with_lse_one(fake):
    """cuDNN refuses sink_token on a one-row graph; a one-row LSE is declared in FlashInfer's form
    (Stats (B, Hq, 1, 1) at the packed LSE's strides, no ragged offset) on a one-row graph."""
    case = fp32_case("d", ((1, 1), (9, 20)), phase="decode")
    _, batch, plan = run_adapter(case)
    assert plan.key.s_q == 1 and plan.key.lse_padded and adapter.UID_OFF_STATS not in plan.inputs
    assert fake.graphs[-1].stats.ragged is None and tuple(fake.graphs[-1].stats.stride) == (8, 1, 8, 1)
    ref_out, ref_lse = oracle(case.problem, batch)
    assert rel_error(batch.out, ref_out) < 1e-5 and rel_error(batch.lse, ref_lse) < 1e-5
    _, _, plan = run_adapter(fp32_case("d", ((1, 1), (9, 20)), phase="decode", has_sinks=True))
    assert plan.key.s_q == 2
    _, batch, plan = run_adapter(fp32_case("d", ((1, 1), (9, 20)), phase="decode", return_lse=False))
    problem = fp32_case("d", ((1, 1), (9, 20)), phase="decode", return_lse=False).problem
    assert plan.key.s_q == 1 and rel_error(batch.out, oracle(problem, batch)[0]) < 1e-5


def test_negative_scale_is_refused_before_launch(fake):
    case = fp32_case("neg")
    batch = make_batch(case, CPU)
    batch.sm_scale = -0.2
    backend = adapter.CudnnBackend()
    with pytest.raises(BackendRejected) as err:
        backend.plan(case.problem, batch)
    assert [(r.field, r.value) for r in err.value.reasons] == [("sm_scale", -0.2)]
    assert backend.cached_keys() == [], "no graph is built for a refused call"


# ------------------------------------------------------------ exact repeats (launcher)
REPEAT_LENS = (((7, 33, 2), (47, 33, 72)), ((33, 2, 7), (33, 72, 47)))  # same facts, other index values


def _planned_and_run(backend, case, seed=1, **extras):
    batch = make_batch(case, CPU, seed=seed)
    batch.extras = dict(extras)
    plan = backend.plan(case.problem, batch)
    backend.run(plan, batch)
    return plan, batch


@pytest.mark.parametrize("frontend", list(FRONTENDS))
@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_a_repeat_hands_cudnn_the_pack_run_would(monkeypatch, frontend, storage):
    # The launcher of a function entry's lane, on a later call with other data and other index
    # values: the operands are this call's, every metadata buffer holds what run derives for it.
    fake = make_fake_cudnn(frontend=frontend)
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    changes = dict(kv_storage="ragged", page_size=0) if storage == "ragged" else {}
    backend = adapter.CudnnBackend()
    plan, first = _planned_and_run(backend, fp32_case("a", REPEAT_LENS[0], **changes))
    launch = backend.launcher(plan, first)
    again = make_batch(fp32_case("b", REPEAT_LENS[1], **changes), CPU, seed=2)
    launch(again)
    launched, launched_reads, out, lse = fake.executions[-1], fake.reads[-1], again.out.clone(), again.lse.clone()
    backend.run(plan, again)
    ran, ran_reads = fake.executions[-1], fake.reads[-1]
    assert fake.calls[-2:] == [frontend, frontend] and sorted(launched) == sorted(ran)
    operands = {adapter.UID_Q: again.q, adapter.UID_K: again.k, adapter.UID_V: again.v, adapter.UID_O: again.out,
                adapter.UID_STATS: again.lse}
    for uid, tensor in operands.items():
        assert launched[uid] == tensor.data_ptr(), uid
    assert sorted(ran_reads) == sorted(set(ran) - set(operands))
    for uid, values in ran_reads.items():
        assert torch.equal(launched_reads[uid], values), uid
    ref_out, ref_lse = oracle(plan.problem, again)
    assert rel_error(out, ref_out) < 1e-5 and rel_error(lse, ref_lse) < 1e-5  # base 2, like run


def test_a_repeat_rereads_the_function_entries_index_values(fake):
    # Nothing of the first call's lengths, offsets or page table is baked into the launch.
    backend = adapter.CudnnBackend()
    plan, first = _planned_and_run(backend, fp32_case("a", REPEAT_LENS[0]))
    launch = backend.launcher(plan, first)
    for seed, lens in enumerate(REPEAT_LENS[::-1] * 2):
        again = make_batch(fp32_case("b", lens), CPU, seed=10 + seed)
        launch(again)
        assert rel_error(again.out, oracle(plan.problem, again)[0]) < 1e-5, lens


def test_a_wrapper_repeat_binds_its_static_buffers_once(fake):
    # The wrapper's index tensors are its plan's (static_indices): the buffers derived from them
    # at plan time are bound at every repeat, nothing is derived again; sinks stay per call.
    backend = adapter.CudnnBackend()
    case = fp32_case("w", has_sinks=True)
    plan, first = _planned_and_run(backend, case, static_indices=True)
    launch = backend.launcher(plan, first)
    for seed in (5, 6):
        again = replace(first, q=torch.randn_like(first.q), out=torch.full_like(first.out, float("nan")),
                        lse=torch.full_like(first.lse, float("nan")), sinks=torch.randn_like(first.sinks))
        torch.manual_seed(seed)
        launch(again)
        pack = fake.executions[-1]
        for uid in (adapter.UID_OFF_Q, adapter.UID_SEQ_KV, adapter.UID_TABLE_K, adapter.UID_OFF_STATS):
            assert pack[uid] == plan.inputs[uid].data_ptr(), uid
        assert pack[adapter.UID_SINK] == again.sinks.data_ptr()
        ref_out, ref_lse = oracle(case.problem, again)
        assert rel_error(again.out, ref_out) < 1e-5 and rel_error(again.lse, ref_lse) < 1e-5


def test_a_repeat_binds_the_entrys_own_pools(fake):
    # The cuDNN entry hands its caller's (pages, Hkv, P, D) pools in extras: a repeat binds them
    # (no view back from the logical pages per call) and still computes the oracle's answer.
    backend = adapter.CudnnBackend()
    case = fp32_case("p")
    plan, first = _planned_and_run(backend, case)
    pools = {"pool_k": first.k.permute(0, 2, 1, 3).clone(), "pool_v": first.v.permute(0, 2, 1, 3).clone()}
    first.extras = {"cudnn": pools}
    launch = backend.launcher(plan, first)
    again = make_batch(case, CPU, seed=8)
    again.extras = {"cudnn": {"pool_k": again.k.permute(0, 2, 1, 3).clone(),
                              "pool_v": again.v.permute(0, 2, 1, 3).clone()}}
    launch(again)
    pack = fake.executions[-1]
    assert pack[adapter.UID_K] == again.extras["cudnn"]["pool_k"].data_ptr()
    assert pack[adapter.UID_V] == again.extras["cudnn"]["pool_v"].data_ptr()
    assert rel_error(again.out, oracle(case.problem, again)[0]) < 1e-5


def test_a_repeat_applies_a_float_out_scale(fake):
    backend = adapter.CudnnBackend()
    case = replace(fp32_case("s"), out_scale=0.5)
    plan, first = _planned_and_run(backend, case)
    launch = backend.launcher(plan, first)
    again = make_batch(case, CPU, seed=7)
    launch(again)
    assert rel_error(again.out, oracle(case.problem, again)[0]) < 1e-5


def test_no_launcher_for_device_scales(fake):
    backend = adapter.CudnnBackend()
    case = replace(fp32_case("t"), tensor_scales=True)
    plan, batch = _planned_and_run(backend, case)
    assert backend.launcher(plan, batch) is None  # run keeps serving: the scale is read per call
    plan, batch = _planned_and_run(backend, fp32_case("f"))
    assert callable(backend.launcher(plan, batch))


def test_a_launcher_for_another_key_uses_that_keys_graph(fake):
    # The kept plan is per call key; a lane's batch of another bucket gets its own key's graph,
    # as run gives it, never the plan's.
    backend = adapter.CudnnBackend()
    plan, _ = _planned_and_run(backend, fp32_case("a"))
    longer = make_batch(fp32_case("b", ((70, 3, 2), (80, 33, 72))), CPU, seed=3)
    launch = backend.launcher(plan, longer)
    launch(longer)
    assert len(fake.graphs) == 2 and fake.graphs[-1].q.dim[2] == 128
    assert rel_error(longer.out, oracle(plan.problem, longer)[0]) < 1e-5


def test_the_launcher_runs_under_the_tensors_gpu(fake, monkeypatch):
    wrapped = []
    real = adapter.on_device_launch
    monkeypatch.setattr(adapter, "on_device_launch", lambda device, fn: wrapped.append(device) or real(device, fn))
    backend = adapter.CudnnBackend()
    plan, batch = _planned_and_run(backend, fp32_case("g"))
    backend.launcher(plan, batch)
    assert wrapped == [batch.q.device]


@pytest.mark.parametrize("path", ["run", "launcher"])
def test_the_stream_is_set_when_it_changes(fake, monkeypatch, path):
    # cudnnSetStream queries the driver on every call: set once per change, not per launch.
    backend = adapter.CudnnBackend()
    gpu = torch.device("cuda", 0)
    handle = backend._handles[gpu] = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=11))
    streams = iter([11, 11, 22, 22, 11])
    monkeypatch.setattr(adapter, "_current_stream", lambda device: next(streams))
    handle_now = backend._handle_on_stream(fake, gpu) if path == "launcher" else None
    for _ in range(5):
        assert (handle_now() if handle_now else backend._stream_handle(fake, gpu)) is handle
    assert fake.streams[-3:] == [(handle, 11), (handle, 22), (handle, 11)] and len(fake.streams) <= 4
