"""A wrapper's plan() does the planning, as FlashInfer's does: the backend is planned there when its
plan reads only what plan() knows, the page lists and index values FlashInfer's plan reads are kept
on the host (no synchronizing copy back from the device), and the first run only launches."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import dispatch
from backends import get_backend
from dispatch import router
from backends._fi_prefill import FlashInferPrefill
from dispatch.benchmark.cases import paged, paged_wrapper, ragged, ragged_wrapper


def test_the_paged_wrapper_plans_its_backend_in_plan_and_runs_without_planning(monkeypatch):
    reference = get_backend("reference")
    plans = []
    real = reference.plan
    monkeypatch.setattr(reference, "plan", lambda problem, batch: plans.append(problem) or real(problem, batch))
    c = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13))
    with dispatch.use_backend("reference"):
        w = paged_wrapper(c)
        assert len(plans) == 1  # planned by plan(), before any run
        out = w.run(c["q"], c["cache"])
        w.run(c["q"], c["cache"])
    assert len(plans) == 1 and torch.isfinite(out).all()


def test_the_paged_plan_keeps_the_callers_page_lists_and_index_values_on_the_host():
    c = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13))
    start = 2  # page lists that start inside a longer array (FlashInfer's indptr need not start at 0)
    indptr = c["kv_indptr"] + start
    ids = torch.cat([torch.tensor([77, 78], dtype=torch.int32), c["perm"].to(torch.int32)])
    with dispatch.use_backend("reference"):
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
        w.plan(c["qo"], indptr, ids, c["last"], c["num_qo_heads"], c["num_kv_heads"], c["head_dim"],
               c["page_size"], causal=True, q_data_type=c["dtype"])
    page_indptr, page_ids, last = w._extras["paged_csr"]
    assert page_indptr.device.type == "cpu" and page_indptr.tolist() == c["kv_indptr"].tolist()
    assert torch.equal(page_ids, c["perm"].to(torch.int32)) and last.tolist() == c["last"].tolist()
    host = w._extras["host_indices"]
    assert host["qo_indptr"].tolist() == c["qo"].tolist() and host["kv_lens"].tolist() == [9, 4, 13]
    assert all(t.device.type == "cpu" for t in host.values())
    with dispatch.use_backend("reference"):  # the same attention as the page lists from 0
        out = w.run(c["q"], c["cache"])
        expected = paged_wrapper(c).run(c["q"], c["cache"])
    assert torch.equal(out, expected)


def test_flashinfers_plan_takes_the_host_copies_when_the_wrapper_kept_them():
    c, r = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13)), ragged(q_lens=(3, 1), kv_lens=(9, 4))
    with dispatch.use_backend("reference"):
        pw, rw = paged_wrapper(c), ragged_wrapper(r)
    for w, storage in ((pw, "paged"), (rw, "ragged")):
        batch = w._plan_batch()
        problem = w._plan.problem
        kwargs: dict = {}
        args = FlashInferPrefill("fa2")._index_args(problem, batch, kwargs)
        host = w._extras["host_indices"]
        assert args[0] is host["qo_indptr"]
        if storage == "paged":
            assert args[1:4] == w._extras["paged_csr"] and kwargs["seq_lens"] is host["kv_lens"]
        else:
            assert args[1] is host["kv_indptr"] and args[1].tolist() == r["kv"].tolist()


def test_multi_item_scoring_is_refused_by_both_wrappers_never_dropped():
    """FlashInfer's plan(prefix_len_ptr=..., token_pos_in_items_ptr=...) masks items; dropping those
    arguments would compute plain attention: both wrappers refuse them before anything is planned."""
    c, r = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13)), ragged(q_lens=(3, 1), kv_lens=(9, 4))
    items = [("prefix_len_ptr", torch.tensor([2, 0, 0], dtype=torch.uint32)),
             ("token_pos_in_items_ptr", torch.zeros(9, dtype=torch.uint16)),
             ("max_item_len_ptr", torch.tensor([3, 1, 5], dtype=torch.uint16)), ("token_pos_in_items_len", 4)]
    for name, value in items:
        with pytest.raises(ValueError, match=f"{name}=.*multi-item scoring"):
            paged_wrapper(c, **{name: value})
        with pytest.raises(ValueError, match=f"{name}=.*multi-item scoring"):
            ragged_wrapper(r, **{name: value})


def _plan_args(lens: list[int], page: int = 4):
    counts = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.randperm(64)[: sum(counts)].to(torch.int32)
    last = torch.tensor([n - (c - 1) * page for n, c in zip(lens, counts)], dtype=torch.int32)
    qo = torch.arange(len(lens) + 1, dtype=torch.int32)
    return qo, indptr, ids, last


def test_a_plan_of_a_seen_key_runs_every_check_without_pydantic(monkeypatch):
    """An engine's plan per step: the first plan of a key is validated by pydantic, the next ones
    (new lengths, same kinds of arguments) by the spec's own checks, which still refuse bad values
    with the same message; the outputs match the oracle either way."""
    from dispatch import checks
    from dispatch.entries import _base

    _base.TYPED_KEYS.clear()
    full = []
    real = checks.validate
    monkeypatch.setattr(checks, "validate", lambda *a: full.append(a[0].__name__) or real(*a))
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    cache = torch.randn(64, 2, 4, 2, 16)
    for step, lens in enumerate(([5, 9], [7, 12, 3], [1, 16])):
        qo, indptr, ids, last = _plan_args(lens)
        w.plan(qo, indptr, ids, last, 4, 2, 16, 4, causal=True, q_data_type=torch.float32)
        q = torch.randn(len(lens), 4, 16)
        out = w.run(q, cache)
        for b, n in enumerate(lens):
            pages = ids[indptr[b]: indptr[b + 1]].long()
            k = cache[pages, 0].reshape(-1, 2, 16)[:n].repeat_interleave(2, 1)
            v = cache[pages, 1].reshape(-1, 2, 16)[:n].repeat_interleave(2, 1)
            p = torch.softmax(torch.einsum("hd,khd->hk", q[b].double(), k.double()) / 4.0, -1)
            assert torch.allclose(out[b].double(), torch.einsum("hk,khd->hd", p, v.double()), atol=1e-5)
    assert full.count("PagedPlanSpec") == 1
    qo, indptr, ids, last = _plan_args([5, 9])
    last[1] = 5  # a last page longer than page_size=4
    with pytest.raises(ValueError, match=r"paged_kv_last_page_len\[1\].*in \[1, page_size=4\]"):
        w.plan(qo, indptr, ids, last, 4, 2, 16, 4, causal=True, q_data_type=torch.float32)
    qo, indptr, ids, last = _plan_args([5, 9])
    with pytest.raises(ValueError, match="num_kv_heads"):  # another value: another key, validated in full
        w.plan(qo, indptr, ids, last, 4, 3, 16, 4, causal=True, q_data_type=torch.float32)
    assert full.count("PagedPlanSpec") == 2


def test_a_known_typed_key_fills_left_out_fields_as_the_model_would():
    """The plain path of a seen key fills left-out fields with their defaults, a default factory
    with a new value each time (as pydantic does), never one value shared between calls."""
    from pydantic import Field

    from dispatch.checks import Spec

    class WithDefaults(Spec):
        a: int
        b: int = 3
        c: list = Field(default_factory=list)

    first, second = WithDefaults.with_defaults({"a": 1}), WithDefaults.with_defaults({"a": 2, "b": 5})
    assert first == {"a": 1, "b": 3, "c": []} and second == {"a": 2, "b": 5, "c": []}
    assert first["c"] is not second["c"]


def test_a_paged_plans_block_table_is_made_when_a_backend_first_reads_it(monkeypatch):
    """FlashInfer's kernels take the caller's page lists, so a plan they serve never needs our block
    table: it is made from the plan's page lists the first time a backend reads it, once per plan,
    and equals the table made at once; a graph-mode wrapper makes it in plan() (its capture reads it)."""
    from dispatch.checks import block_table_from_pages
    from dispatch.entries import _wrapper
    from dispatch.entries import paged as paged_entry

    made = []
    for module in (_wrapper, paged_entry):  # made on first read (_wrapper), at once for a graph (paged)
        monkeypatch.setattr(module, "block_table_from_pages", lambda *a: made.append(1) or block_table_from_pages(*a))
    c = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13))
    with dispatch.use_backend("reference"):
        w = paged_wrapper(c)
        assert len(made) == 1  # a backend that reads it: made in plan(), never inside a later capture
        out = w.run(c["q"], c["cache"])
    expected = block_table_from_pages(c["kv_indptr"].tolist(), c["perm"].to(torch.int32), "cpu")
    assert len(made) == 1 and torch.equal(w._plan.block_table, expected)  # once
    w._plan.block_table, made[:] = None, []  # a plan nobody has read the table of yet
    batch = w._plan_batch()
    assert made == [] and batch.batch_size == 3  # built lazily: nothing made by building the batch
    assert torch.equal(batch.block_table, expected) and torch.equal(w._plan_batch().block_table, expected)
    assert len(made) == 1
    with dispatch.use_backend("reference"):
        assert torch.equal(w.run(c["q"], c["cache"]), out)
    graph = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), use_cuda_graph=True)
    made[:] = []

    def decided(*args, **kwargs):  # the plan is made before its decision: stop there (no CPU graph backend)
        raise LookupError("decided")
    monkeypatch.setattr(router, "decide", decided)
    with pytest.raises(LookupError):
        graph.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], c["num_qo_heads"], c["num_kv_heads"],
                   c["head_dim"], c["page_size"], causal=True, q_data_type=c["dtype"])
    assert made == [1] and torch.equal(graph._plan.block_table, expected) and graph._plan.pages is None


def test_flashinfers_batch_kernels_read_the_page_lists_not_the_block_table():
    """A paged plan FlashInfer serves makes no block table (it takes the caller's page lists); a
    CUDA-graph plan sizes FlashInfer's index buffers by the table, and every other backend reads it."""
    c = paged(q_lens=(3, 1, 5), kv_lens=(9, 4, 13))
    with dispatch.use_backend("reference"):
        problem = paged_wrapper(c)._plan.problem
    graph = dataclasses.replace(problem, cuda_graph=True)
    assert FlashInferPrefill("fa2").reads_block_table(problem) is False
    assert FlashInferPrefill("fa2").reads_block_table(graph) is True
    assert get_backend("reference").reads_block_table(problem) and get_backend("native-triton").reads_block_table(problem)
