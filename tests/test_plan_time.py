"""A wrapper's plan() does the planning, as FlashInfer's does: the backend is planned there when its
plan reads only what plan() knows, the page lists and index values FlashInfer's plan reads are kept
on the host (no synchronizing copy back from the device), and the first run only launches."""
from __future__ import annotations

import pytest
import torch

import dispatch
from backends import get_backend
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
