"""A CUDA graph fixes its backend: a graph's decision weighs every kv bucket it replays, from the
shortest up to its bound (a graph wrapper's capacity, a call's kv length bound), not the best of
the plan's bucket. CPU only: the GPU is a description, the table synthetic."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import _api_cases as api_cases
import capability_db
import dispatch
from _tables import use_table
from capability_db.choice_table import ChoiceTable, grid_points, key_of
from dispatch import choice, router
from dispatch.benchmark.cases import paged
from dispatch.benchmark.vendors import make_problem

H100 = capability_db.resolve_device("h100")
KV = (64, 256, 1024, 4096, 16384, 65536)
# xqa is the faster at the plan's bucket (kv 4096, read at 3072) and longer; fa2 at the short
# lengths a graph replays too: summed over kv 64..16384 fa2 takes 0.382 ms, xqa 0.41
XQA = dict(zip(KV, (0.050, 0.050, 0.050, 0.060, 0.200, 0.800)))
FA2 = dict(zip(KV, (0.010, 0.012, 0.030, 0.080, 0.250, 1.000)))


@pytest.fixture(autouse=True)
def fresh():
    router.clear_caches()
    yield
    router.clear_caches()


def by_kv_table(problem, times: dict[str, dict[int, float]]) -> ChoiceTable:
    """A table where ``problem``'s key has, per backend, GPU ms by kv length (the same at every batch
    and q); a backend without a time at a kv length is left out there."""
    names = sorted(times)
    cells = {}
    for point in grid_points(problem):
        there = sorted((t[point[2]], names.index(n)) for n, t in times.items() if point[2] in t)
        cells[",".join(map(str, point))] = " ".join(f"{i} {ms}" for ms, i in there)
    data = {"gpu": "h100", "sm": 90, "backends": names, "host_us": {}, "launch_us": {}, "factors": {},
            "keys": {key_of(problem): cells}}
    return ChoiceTable("h100", 90, data)


def plan_problem(**kw):
    """A paged decode plan (GQA 4, head dim 128) of batch 8 at kv class 4096."""
    return make_problem(entry="BatchPrefillWithPagedKVCacheWrapper", phase="decode", num_qo_heads=32, num_kv_heads=8,
                        head_dim_qk=128, head_dim_vo=128, device_type="cuda", sizes=(8, 1, 4096), **kw)


def test_a_graph_picks_the_lowest_total_over_the_kv_buckets_it_replays_an_eager_call_its_own_bucket(monkeypatch):
    use_table(monkeypatch, by_kv_table(plan_problem(), {"xqa": XQA, "fa2": FA2}))
    eager = router.decide(plan_problem(), H100, live=False)
    one_bucket = router.decide(plan_problem(cuda_graph=True), H100, live=False)  # no replay bound: its sizes
    graph = router.decide(plan_problem(cuda_graph=True, replay_kv=16384), H100, live=False)
    assert eager.chosen == "xqa" and one_bucket.chosen == "xqa"
    assert graph.chosen == "fa2" and graph.accepted()[:2] == ["fa2", "xqa"]
    assert graph.ranking.startswith("CUDA graph: lowest total expected time over kv buckets 64..16384 "
                                    "(64, 256, 1024, 4096, 16384) at batch 6 x q 1")
    text = " ".join(graph.explain().split())
    assert "ranked by: CUDA graph: lowest total expected time over kv buckets 64..16384" in text
    assert "up to 16384" in text and "GPU time only" in text
    fa2 = next(c for c in graph.candidates if c.backend == "fa2")
    assert math.isclose(fa2.evidence.ms, (0.010 + 0.012 + 0.030 + 0.080 + 0.250) / 5, rel_tol=1e-9)
    assert fa2.estimate == "table: 0.0764 ms per replay, mean over kv 64..16384 (5 buckets) at batch 6 x q 1"
    assert "CUDA graph" not in eager.ranking and "host time per eager call" in eager.ranking


def test_the_graph_decision_is_made_once_and_cached_with_the_problem(monkeypatch):
    use_table(monkeypatch, by_kv_table(plan_problem(), {"xqa": XQA, "fa2": FA2}))
    calls = []
    real = choice.rank
    monkeypatch.setattr(choice, "rank", lambda *a, **k: calls.append(a) or real(*a, **k))
    p = plan_problem(cuda_graph=True, replay_kv=16384)
    first = router.decide(p, H100, live=False)
    assert all(router.decide(p, H100, live=False) is first for _ in range(3)) and len(calls) == 1


def test_a_backend_the_table_leaves_out_at_a_bucket_counts_keep_within_times_that_buckets_fastest(monkeypatch):
    """cuDNN is the fastest at kv 16384 but left out below it (slower there than those the table
    keeps): counted as 2.5x the fastest at each of those buckets, it goes last, not first."""
    cudnn = {16384: 0.150}
    use_table(monkeypatch, by_kv_table(plan_problem(), {"xqa": XQA, "fa2": FA2, "cudnn": cudnn}))
    graph = router.decide(plan_problem(cuda_graph=True, replay_kv=16384), H100, live=False)
    ms = {c.backend: c.evidence.ms for c in graph.candidates if c.evidence is not None}
    assert math.isclose(ms["cudnn"], (2.5 * (0.010 + 0.012 + 0.030 + 0.060) + 0.150) / 5, rel_tol=1e-9)
    assert graph.chosen == "fa2" and graph.accepted()[:3] == ["fa2", "xqa", "cudnn"]


def test_the_replayed_buckets_run_from_the_shortest_a_replay_reads_to_the_bound():
    decode = plan_problem(cuda_graph=True, replay_kv=16384)
    assert [kv for _, _, kv in choice.replay_points(decode, (8, 1, 4096))] == [64, 256, 1024, 4096, 16384]
    assert choice.replay_points(decode, (8, 1, 4096))[0][:2] == (6, 1)  # the class's middle batch
    # a prefill's kv holds its own queries: from q (768, the middle of 1024) up; a bound off the grid
    prefill = dataclasses.replace(decode, phase="prefill", replay_kv=8192)
    assert [kv for _, _, kv in choice.replay_points(prefill, (8, 1024, 2048))] == [768, 1024, 4096, 8192]
    assert [choice.replay_bound(n) for n in (1, 64, 100, 4096, 4097)] == [1, 64, 128, 4096, 8192]


def recording(monkeypatch) -> list:
    """The problems the router is asked to decide, recorded; each stops its call (LookupError)."""
    seen = []

    def record(problem, *args, **kw):
        seen.append(problem)
        raise LookupError("recorded")
    monkeypatch.setattr(router, "decide", record)
    return seen


def planned_problem(monkeypatch, use_cuda_graph: bool, kv_lens, max_sequence_kv=None, **buffers):
    """The problem a paged wrapper's plan() decides."""
    seen = recording(monkeypatch)
    c = paged(q_lens=(1,) * len(kv_lens), kv_lens=kv_lens)
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8), use_cuda_graph=use_cuda_graph,
                                                     **buffers)
    with pytest.raises(LookupError):
        w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], c["num_qo_heads"], c["num_kv_heads"],
               c["head_dim"], c["page_size"], q_data_type=c["dtype"], max_sequence_kv=max_sequence_kv)
    return seen[0]


def test_a_graph_wrappers_plans_decide_for_its_capacity_and_share_one_decision(monkeypatch):
    """use_cuda_graph=True: the plan's problem carries the longest kv its graph replays (max_sequence_kv
    or its longest request, rounded up to a power of two) and is sized by it, so the plans of one
    graph wrapper are one decision key; an eager wrapper's plan is sized by its own lengths."""
    first = planned_problem(monkeypatch, True, (900, 3000, 20), max_sequence_kv=12000)
    later = planned_problem(monkeypatch, True, (40, 700, 1500), max_sequence_kv=12000)
    assert first == later and (first.replay_kv, first.sizes, first.cuda_graph) == (16384, (4, 1, 16384), True)
    assert planned_problem(monkeypatch, True, (900, 3000, 20)).replay_kv == 4096  # no bound given: its longest
    eager = planned_problem(monkeypatch, False, (900, 3000, 20), max_sequence_kv=12000)
    assert (eager.replay_kv, eager.sizes, eager.cuda_graph) == (0, (4, 1, 4096), False)
    # such a problem decided on an H100 (bf16, head dim 128: fa2 and xqa accept it): the graph's choice
    monkeypatch.undo()
    on_gpu = dataclasses.replace(first, device_type="cuda", q_dtype="bfloat16", kv_dtype="bfloat16",
                                 out_dtype="bfloat16", head_dim_qk=128, head_dim_vo=128)
    use_table(monkeypatch, by_kv_table(on_gpu, {"xqa": XQA, "fa2": FA2}))
    decision = router.decide(on_gpu, H100, live=False)
    assert decision.ranking.startswith("CUDA graph: lowest total expected time over kv buckets 64..16384")
    assert decision.chosen == "fa2"
    assert "replay_kv" not in first.facts()  # not a capability fact


def test_a_call_whose_kv_size_is_its_length_bound_replays_up_to_it(monkeypatch):
    """cuDNN's call declared for a graph (is_cuda_graph_compatible) replays every kv length up to
    max_sequence_kv: that bound's class is its problem's replay_kv."""
    seen = recording(monkeypatch)
    args, kw = api_cases.cudnn_args(api_cases.paged(), is_cuda_graph_compatible=True, max_sequence_kv=5000)
    with pytest.raises(LookupError):
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert (seen[0].cuda_graph, seen[0].replay_kv, seen[0].sizes[2]) == (True, 8192, 8192)


def test_a_graph_wrapper_given_an_indices_buffer_replays_up_to_its_pages(monkeypatch):
    """FlashInfer's graph mode replays any plan whose page ids fit the paged_kv_indices_buf: without
    max_sequence_kv, a request may hold every page of it (pages x page_size keys); max_sequence_kv,
    where given, still decides; an eager wrapper ignores the buffer."""
    page = paged(q_lens=(1,), kv_lens=(40,))["page_size"]
    buf = dict(paged_kv_indices_buf=torch.empty(1000, dtype=torch.int32))
    graph = planned_problem(monkeypatch, True, (900, 3000, 20), **buf)
    assert graph.replay_kv == choice.replay_bound(1000 * page)
    monkeypatch.undo()
    assert planned_problem(monkeypatch, True, (900, 3000, 20), max_sequence_kv=5000, **buf).replay_kv == 8192
    monkeypatch.undo()
    assert planned_problem(monkeypatch, False, (900, 3000, 20), **buf).replay_kv == 0
