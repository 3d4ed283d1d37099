"""Ranking from measurements: the GPU's choice table, ties, backends the table leaves out, one
ranking per decision (never per call), and the warm-up autotune: its context, what it times, its
cache file."""
from __future__ import annotations

import dataclasses
import math
import json

import pytest
import torch

import capability_db
from _tables import synthetic_table, use_table
from capability_db import choice_table
from capability_db.choice_table import corners, key_of, point_of
import dispatch
from dispatch import autotune, choice, router, timing
from dispatch.benchmark.vendors import make_problem

H100 = capability_db.resolve_device("h100")


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv(autotune.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    monkeypatch.setattr(autotune, "_known", {})
    monkeypatch.setattr(autotune, "_read_default", set())
    monkeypatch.setattr(autotune, "_logged", set())
    monkeypatch.setattr(autotune, "_contexts", [])
    router.clear_caches()
    yield
    router.clear_caches()


def decode_problem(**kw):
    return make_problem(entry="BatchPrefillWithPagedKVCacheWrapper", phase="decode", num_qo_heads=32,
                        num_kv_heads=8, head_dim_qk=128, head_dim_vo=128, device_type="cuda", **kw)


def with_times(monkeypatch, ms: dict[str, float], host_us: dict | None = None):
    """The decode problem, ranked by a synthetic table with GPU ``ms`` per backend at every size."""
    p = decode_problem()
    use_table(monkeypatch, synthetic_table(p, ms, host_us))
    return p


def test_a_gpu_ranks_by_its_own_compiled_table_and_the_cpu_has_none():
    t = choice_table.table_for(H100)
    assert (t.gpu, t.sm, t.scaling) == ("h100", 90, "") and {"fa2", "fa3", "cudnn", "xqa"} <= set(t.data["backends"])
    assert choice_table.table_for(capability_db.CPU_DEVICE) is None


def test_the_fastest_candidate_is_chosen_and_explained(monkeypatch):
    p = with_times(monkeypatch, {"fa2": 0.40, "xqa": 0.20, "cudnn": 0.41, "native-triton": 0.30})
    d = router.decide(p, H100, live=False)
    assert d.chosen == "xqa" and d.accepted()[:2] == ["xqa", "native-triton"]
    text = " ".join(d.explain().split())
    assert "table: 0.2 ms at batch 64 x q 1 x kv 4096" in text
    assert text.count("capability_db/tables/h100.json") == 2  # the ranking's line and the estimates' source, once
    assert d.ranking.startswith("expected time (capability_db/tables/h100.json; the phase's anchor sizes")


def test_a_tie_keeps_the_priority_order(monkeypatch):
    p = with_times(monkeypatch, {"fa2": 0.400, "xqa": 0.395, "cudnn": 0.5, "native-triton": 0.6})
    assert router.decide(p, H100, live=False).chosen == "fa2"  # 1.3% apart: the priority list decides


def test_backends_the_table_leaves_out_go_after_those_it_has_in_priority_order(monkeypatch):
    """A table keeps only the backends within a few times the fastest at a point: one missing there
    is slower than those it has."""
    p = with_times(monkeypatch, {"cudnn": 0.40, "native-triton": 0.30})
    d = router.decide(p, H100, live=False)
    est = {c.backend: c.estimate for c in d.candidates if c.accepted and c.ranked}
    assert est["native-triton"].startswith("table") and est["cudnn"].startswith("table")
    assert not est["fa2"] and not est["xqa"] and not est["reference"]
    assert d.accepted() == ["native-triton", "cudnn", "fa2", "xqa", "reference"]


def test_ranking_happens_once_per_decision(monkeypatch):
    calls = []
    real = choice.rank
    monkeypatch.setattr(choice, "rank", lambda *a, **k: calls.append(a) or real(*a, **k))
    p = decode_problem()
    for _ in range(5):
        router.decide(p, H100, live=False)
    assert len(calls) == 1


def test_cpu_choice_is_the_priority_list():
    p = make_problem(phase="decode")
    d = router.decide(p, capability_db.CPU_DEVICE, live=False)
    assert d.chosen == "reference" and d.ranking == ""


# -- autotune -----------------------------------------------------------------------------------
def cpu_problem(**kw):
    return make_problem(phase="decode", q_dtype="float32", kv_dtype="float32", out_dtype="float32", **kw)


def fake_measure(monkeypatch, ms: dict, timed: list | None = None):
    """``autotune.measure`` returns ``ms`` (backend -> GPU ms) for the names asked; ``timed`` collects them."""
    def measure(problem, names, sizes, lengths=None):
        (timed if timed is not None else []).extend(names)
        return {n: ms.get(n) for n in names}
    monkeypatch.setattr(autotune, "measure", measure)


def never_measure(monkeypatch):
    monkeypatch.setattr(autotune, "measure", lambda *a: pytest.fail("timed outside a tuning context"))


def test_outside_a_context_nothing_is_timed(monkeypatch):
    never_measure(monkeypatch)
    assert autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"], (2, 1, 40)) is None
    with autotune.autotune(False):  # tune_mode=False: lookups only, as FlashInfer's
        assert autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"],
                               (2, 1, 40)) is None
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "1")  # the old switch: no value of it times anything now
    assert autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"], (2, 1, 40)) is None


def test_a_context_times_a_new_bucket_once_and_keeps_it_in_the_default_file(monkeypatch, tmp_path):
    p = cpu_problem()
    with dispatch.autotune(True):  # the module is callable: dispatch.autotune(...) is the context
        got = autotune.lookup(p, capability_db.CPU_DEVICE, ["reference"], (2, 1, 40))
        assert not list(tmp_path.glob("autotune-*.json"))  # written when the context closes
    ms, sizes, host_us, measured = got["reference"]
    assert ms > 0 and sizes == (2, 1, 48) and host_us is None  # the bucket (2, 1, 64)'s middle; no host on the CPU
    [path] = tmp_path.glob("autotune-*.json")
    data = json.loads(path.read_text())
    assert data["format"] == autotune.FORMAT and set(data["environment"]) == {
        "gpu", "sm", "sm_count", "driver", "cuda", "cudnn", "cudnn_frontend", "flashinfer", "torch", "triton",
        "attn_dispatch"}
    [bucket] = data["buckets"].values()
    assert bucket["measured"] == measured and bucket["times"]["reference"]["ms"] == ms
    monkeypatch.setattr(autotune, "_known", {})  # a new process reads the file at first use, times nothing
    monkeypatch.setattr(autotune, "_read_default", set())
    never_measure(monkeypatch)
    assert autotune.lookup(p, capability_db.CPU_DEVICE, ["reference"], (2, 1, 33))["reference"].ms == ms
    with autotune.autotune(True):  # a known bucket is not timed again
        assert autotune.lookup(p, capability_db.CPU_DEVICE, ["reference"], (2, 1, 33))["reference"].ms == ms


def test_a_context_cache_is_read_at_entry_and_merged_at_exit(monkeypatch, tmp_path):
    """FlashInfer's cache=: loaded when the context opens, merged back (read again: what another
    process wrote meanwhile stays) when it closes."""
    env = autotune.fingerprint(capability_db.CPU_DEVICE)
    path = tmp_path / "shared" / "tuned.json"
    kept = autotune.bucket_key(cpu_problem(), (4, 1, 64))
    autotune.save(path, {kept: {"measured": "2026-01-01T00:00:00+00:00", "times": {"native-triton": {"ms": 1.0}}}}, env)
    fake_measure(monkeypatch, {"reference": 3.0, "native-triton": 2.0})
    with autotune.autotune(True, cache=path):
        hit = autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["native-triton"], (4, 1, 64))
        assert hit["native-triton"].ms == 1.0 and hit["native-triton"].measured.startswith("2026-01-01")
        autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"], (8, 1, 64))
        other = autotune.bucket_key(cpu_problem(), (16, 1, 64))
        autotune.save(path, {other: {"measured": "2026-01-02T00:00:00+00:00", "times": {"reference": 9.0}}}, env)
    buckets = json.loads(path.read_text())["buckets"]
    assert set(buckets) == {kept, other, autotune.bucket_key(cpu_problem(), (8, 1, 64))}
    assert not list(tmp_path.glob("autotune-*.json"))  # cache= given: the default file is not written


def test_a_file_of_another_environment_is_ignored_with_one_line_and_kept(monkeypatch, tmp_path, caplog):
    path = tmp_path / "elsewhere.json"
    env = {**autotune.fingerprint(capability_db.CPU_DEVICE), "torch": "1.0", "gpu": "NVIDIA H200"}
    key = autotune.bucket_key(cpu_problem(), (2, 1, 64))
    autotune.save(path, {key: {"measured": autotune.now(), "times": {"native-triton": {"ms": 0.1}}}}, env)
    before = path.read_text()
    fake_measure(monkeypatch, {"reference": 3.0, "native-triton": 2.0})
    with caplog.at_level("WARNING", logger="attn_dispatch"):
        for _ in range(2):
            with autotune.autotune(True, cache=path):
                hit = autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"],
                                      (2, 1, 64))
                assert hit["native-triton"].ms == 2.0  # timed here, not read from the other environment's file
    lines = [r.getMessage() for r in caplog.records if "elsewhere.json" in r.getMessage()]
    assert len(lines) == 1 and "another environment" in lines[0] and "torch: 1.0 there" in lines[0]
    assert path.read_text() == before  # never overwritten


def test_a_cache_keeps_the_most_recently_measured_buckets(monkeypatch, tmp_path):
    monkeypatch.setattr(autotune, "MAX_BUCKETS", 3)
    env, path = autotune.fingerprint(capability_db.CPU_DEVICE), tmp_path / "capped.json"
    days = {f"b{d}": {"measured": f"2026-01-0{d}T00:00:00+00:00", "times": {"reference": 1.0}} for d in range(1, 6)}
    autotune.save(path, {k: days[k] for k in ("b2", "b4")}, env)
    autotune.save(path, {k: days[k] for k in ("b1", "b3", "b5")}, env)
    assert sorted(json.loads(path.read_text())["buckets"]) == ["b3", "b4", "b5"]  # b1, b2: the oldest out


def test_the_default_file_is_off_with_the_variable_at_0(monkeypatch, tmp_path):
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "0")
    fake_measure(monkeypatch, {"reference": 3.0, "native-triton": 2.0})
    with autotune.autotune(True):
        assert autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference", "native-triton"],
                               (2, 1, 64))["native-triton"].ms == 2.0
    assert not list(tmp_path.glob("autotune-*.json"))


def test_autotune_never_measures_while_compiling(monkeypatch, tmp_path):
    monkeypatch.setattr(autotune.torch.compiler, "is_compiling", lambda: True)
    never_measure(monkeypatch)
    with autotune.autotune(True):
        assert autotune.lookup(cpu_problem(), capability_db.CPU_DEVICE, ["reference"], (2, 1, 40)) is None
    assert not list(tmp_path.glob("autotune-*.json"))


def test_skip_ops_names_entry_points_left_untimed_and_tuning_buckets_are_refused(monkeypatch):
    never_measure(monkeypatch)
    p = cpu_problem()
    with autotune.autotune(True, skip_ops={p.entry}):
        assert not autotune.tuning(p.entry)
        assert autotune.lookup(p, capability_db.CPU_DEVICE, ["reference", "native-triton"], (2, 1, 64)) is None
    with pytest.raises(ValueError, match=r"tuning_buckets=\(64, 128\)\): allowed only None \(dispatch times each bucket"):
        with autotune.autotune(True, tuning_buckets=(64, 128)):
            pass


def test_a_new_bucket_times_the_tables_three_leaders_or_all_within_15_percent(monkeypatch):
    timed = []
    fake_measure(monkeypatch, {}, timed)
    names = ["fa2", "fa3", "cudnn", "xqa", "native-triton"]
    graph = decode_problem(cuda_graph=True)  # GPU time alone: the table's figures are the estimates
    use_table(monkeypatch, synthetic_table(graph, dict(zip(names, (1.0, 2.0, 3.0, 4.0, 5.0)))))
    with autotune.autotune(True):
        autotune.lookup(graph, H100, names, (8, 1, 1024), choice.leading)  # as the router asks
    assert timed == ["fa2", "fa3", "cudnn"]
    timed.clear()
    use_table(monkeypatch, synthetic_table(graph, dict(zip(names, (1.0, 1.05, 1.1, 1.14, 1.2)))))
    with autotune.autotune(True):
        autotune.lookup(graph, H100, names, (8, 1, 2048), choice.leading)
    assert timed == ["fa2", "fa3", "cudnn", "xqa"]  # native-triton: 20% off
    timed.clear()
    with autotune.autotune(True):
        autotune.lookup(graph, H100, names, (8, 1, 4096))  # no leading given: every accepted one
    assert timed == names
    timed.clear()
    use_table(monkeypatch, synthetic_table(graph, dict(zip(names[:4], (1.0, 2.0, 3.0, 4.0)))))
    with autotune.autotune(True):  # the table has no time for native-triton: nothing says it is slower
        autotune.lookup(graph, H100, names, (8, 1, 8192), choice.leading)
    assert timed == ["fa2", "fa3", "cudnn", "native-triton"]


def test_a_new_bucket_is_timed_on_the_lengths_of_the_call_that_opened_it(monkeypatch):
    seen = []

    def measure(problem, names, sizes, lengths=None):
        seen.append((sizes, lengths))
        return {n: 1.0 for n in names}
    monkeypatch.setattr(autotune, "measure", measure)
    names, p = ["fa2", "xqa"], decode_problem()
    own = ([1, 1, 1], [100, 900, 3000])  # a decode batch's spread: size class 4 x 1 x 4096
    with autotune.autotune(True):
        token = autotune.CALL_LENGTHS.set(lambda: own)
        try:
            autotune.lookup(p, H100, names, (3, 1, 3000))
            autotune.lookup(p, H100, names, (3, 1, 9000))  # another bucket (a graph's replay point)
        finally:
            autotune.CALL_LENGTHS.reset(token)
        autotune.lookup(p, H100, names, (16, 1, 512))  # no call: equal lengths at the middle
    assert seen[0] == ((3, 1, 3072), own)
    assert [lengths for _, lengths in seen[1:]] == [None, None]


def test_the_router_hands_the_calls_lengths_to_a_decision_that_times(monkeypatch):
    read, p = [], with_times(monkeypatch, {"fa2": 0.40, "xqa": 0.20})
    lookup = autotune.lookup

    def spy(*args, **kw):
        get = autotune.CALL_LENGTHS.get()
        read.append(get() if get is not None else None)
        return lookup(*args, **kw)
    monkeypatch.setattr(autotune, "lookup", spy)
    fake_measure(monkeypatch, {"fa2": 0.1, "xqa": 0.3})
    with autotune.autotune(True):
        router.decide(p, H100, live=False, lengths=lambda: ([1, 1], [7, 9]))
        router.decide(p, H100, live=False, lengths=lambda: pytest.fail("a cached decision reads no lengths"))
    assert read == [([1, 1], [7, 9])]
    assert autotune.CALL_LENGTHS.get() is None  # reset after the decision


def test_a_function_entrys_host_time_holds_a_plan_where_its_plan_is_not_kept(monkeypatch):
    calls = []

    class Backend:
        def __init__(self, reusable):
            self.reusable = reusable

        def plan_reusable(self, problem):
            return self.reusable

        def plan(self, problem, batch):
            calls.append("plan")

        def run(self, plan, batch):
            calls.append("run")

        def launcher(self, plan, batch):
            return None

    def wall_ms(call, reps, warmup, calls):
        call()
        return 0.001
    monkeypatch.setattr(autotune.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "wall_ms", wall_ms)
    function_entry = dataclasses.replace(decode_problem(), entry="xqa_batch_decode_with_kv_cache")
    for backend, expected in ((Backend(False), ["plan", "run"]), (Backend(True), ["run"])):
        calls.clear()
        assert autotune._host_us(backend, function_entry, None, None) == pytest.approx(1.0)
        assert calls == expected  # a call with new lengths plans again unless the entry keeps the plan


def test_explain_says_which_evidence_decided(monkeypatch):
    p = with_times(monkeypatch, {"fa2": 0.40, "xqa": 0.20, "cudnn": 0.41, "native-triton": 0.30})
    assert router.decide(p, H100, live=False).evidence == "the table"
    fake_measure(monkeypatch, {"fa2": 0.1, "xqa": 0.3, "cudnn": 0.4, "native-triton": 0.5})
    with autotune.autotune(True):  # entering forgets the decision made from the table
        d = router.decide(p, H100, live=False)
    assert d.chosen == "fa2" and d.evidence.startswith("measured here (20") and d.to_json()["evidence"] == d.evidence
    assert "decided by: measured here (" in d.explain()
    assert router.decide(make_problem(phase="decode"), capability_db.CPU_DEVICE, live=False).evidence == "the static order"


def test_autotune_times_order_the_candidates(monkeypatch):
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *_: {"reference": 5.0, "native-triton": 1.0})
    with autotune.autotune(True):
        r = choice.rank(make_problem(phase="decode"), capability_db.CPU_DEVICE, ["reference", "native-triton"])
    assert r.order == ["native-triton", "reference"] and r.basis.startswith("measured here (")
    assert r.estimates["native-triton"].describe().startswith("autotune: 1 ms")


def _tuned_table(monkeypatch, gpu_ms: dict[str, float], host: dict[str, float]):
    """Autotune returns ``gpu_ms``; the table (whose GPU times say the opposite) holds ``host`` us per
    call on every entry."""
    opposite = {n: 1.0 / ms for n, ms in gpu_ms.items() if ms}
    table = synthetic_table(decode_problem(), opposite or {"fa2": 1.0},
                            {n: {e: us for e in measured_entries()} for n, us in host.items()})
    use_table(monkeypatch, table)
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *_: {n: gpu_ms.get(n) for n in names})


def tuned_rank(*args):
    with autotune.autotune(True):
        return choice.rank(*args)


def measured_entries() -> list[str]:
    return ["BatchPrefillWithPagedKVCacheWrapper", "cudnn_batch_prefill_with_kv_cache"]


def test_autotune_counts_the_host_path_of_an_eager_call_and_not_in_a_cuda_graph(monkeypatch):
    # fa2's kernel is 2 us faster, its host path 25 us slower: an eager call costs more on fa2
    _tuned_table(monkeypatch, {"fa2": 0.010, "native-triton": 0.012}, {"fa2": 30.0, "native-triton": 5.0})
    eager = tuned_rank(decode_problem(), H100, ["fa2", "native-triton"], (8, 1, 1024))
    graph = tuned_rank(decode_problem(cuda_graph=True), H100, ["fa2", "native-triton"], (8, 1, 1024))
    assert eager.order == ["native-triton", "fa2"] and "host time per eager call" in eager.basis
    assert eager.estimates["fa2"].host_us == 30.0
    assert graph.order == ["fa2", "native-triton"] and "GPU time only" in graph.basis


def test_autotune_counts_its_own_host_times_over_the_tables(monkeypatch):
    """The host times timed beside the GPU times (this machine, these versions) are counted, not the
    table's (which say fa2 is the cheaper call here); a cache file of GPU times alone still reads."""
    _tuned_table(monkeypatch, {}, {"fa2": 5.0, "native-triton": 30.0})
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *_: {
        "fa2": {"ms": 0.010, "host_us": 30.0}, "native-triton": {"ms": 0.012, "host_us": 5.0}})
    r = tuned_rank(decode_problem(), H100, ["fa2", "native-triton"], (8, 1, 1024))
    assert r.order == ["native-triton", "fa2"] and r.estimates["fa2"].host_source == "autotune"
    assert autotune._timed_entry(0.25, (1, 1, 1), None) == autotune.Timed(0.25, (1, 1, 1), None)


def test_autotune_times_outrank_the_priority_list_and_the_table(monkeypatch):
    """On the cuDNN entry point cuDNN leads its list; the faster ones timed here go first, by the times
    timed (the table, which says the opposite, is not read for GPU times)."""
    _tuned_table(monkeypatch, {"cudnn": 0.030, "native-triton": 0.020, "fa2": 0.005},
                 {"cudnn": 5.0, "native-triton": 5.0, "fa2": 5.0})
    p = dataclasses.replace(decode_problem(), entry="cudnn_batch_prefill_with_kv_cache")
    r = tuned_rank(p, H100, ["cudnn", "fa2", "native-triton"], (8, 1, 1024))
    assert r.order == ["fa2", "native-triton", "cudnn"] and r.basis.startswith("measured here")
    assert r.estimates["cudnn"].describe().startswith("autotune: 0.03 ms")


def test_a_backend_whose_autotune_failed_goes_last(monkeypatch):
    _tuned_table(monkeypatch, {"fa2": None, "native-triton": 0.020, "cudnn": 0.015}, {})
    r = tuned_rank(decode_problem(cuda_graph=True), H100, ["fa2", "native-triton", "cudnn"], (8, 1, 1024))
    assert r.order == ["cudnn", "native-triton", "fa2"] and "fa2" not in r.estimates


def test_autotune_never_times_the_cpu_only_reference_on_a_gpu(monkeypatch):
    """On the H200 the reference took up to 6 s a call: a bucket's timing spent tens of seconds on it."""
    timed = []
    _tuned_table(monkeypatch, {"fa2": 0.010, "reference": 0.001}, {})
    measure = autotune.measure
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *own: timed.extend(names) or measure(problem, names, sizes, *own))
    r = tuned_rank(decode_problem(cuda_graph=True), H100, ["fa2", "reference"], (8, 1, 1024))
    assert timed == ["fa2"] and r.order == ["fa2", "reference"]
    assert autotune.timed_on(capability_db.CPU_DEVICE, ["reference"]) == ["reference"]


def test_reference_serving_a_cuda_problem_warns_once_with_the_others_reasons(caplog):
    # head dim 1024: only the reference accepts it; on an H100 that is worth a warning, once
    p = make_problem(phase="decode", head_dim_qk=1024, head_dim_vo=1024, device_type="cuda")
    with caplog.at_level("WARNING", logger="attn_dispatch"):
        for _ in range(3):
            assert router.decide(p, H100, live=False).chosen == "reference"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "slow PyTorch reference" in warnings[0] and "head_dim" in warnings[0]


def test_the_problems_size_class_reads_the_tables_point_for_those_sizes(monkeypatch):
    """A problem carries its size class (dispatch sets it from the call or the plan): the choice
    follows the table at those sizes, not one order for every size of the problem."""
    p = make_problem(entry="BatchPrefillWithPagedKVCacheWrapper", phase="prefill", num_qo_heads=32, num_kv_heads=8,
                     head_dim_qk=128, head_dim_vo=128, device_type="cuda", causal=True)
    table = synthetic_table(p, {"fa2": 0.85, "fa3": 0.59, "cudnn": 0.62, "native-triton": 1.0})
    names = table.data["backends"]
    short_corners = {c for c, _ in corners(p, point_of(p, (64, 16, 2048)))}  # middle 48 x 12 x 1536
    assert not short_corners & {c for c, _ in corners(p, point_of(p, (8, 2048, 2048)))}
    short_ms = {"fa2": 0.2, "fa3": 0.7, "cudnn": 0.6, "native-triton": 0.9}
    for corner in short_corners:
        table.data["keys"][key_of(p)][",".join(map(str, corner))] = " ".join(
            f"{names.index(n)} {ms}" for n, ms in short_ms.items())
    use_table(monkeypatch, table)
    short = router.decide(dataclasses.replace(p, sizes=(64, 16, 2048)), H100, live=False)
    long = router.decide(dataclasses.replace(p, sizes=(8, 2048, 2048)), H100, live=False)
    assert short.accepted()[0] == "fa2" and long.accepted()[0] == "fa3"
    assert "read at 48 x 12 x 1536" in short.ranking and "0.2 ms at batch 48 x q 12 x kv 1536" in " ".join(
        c.estimate for c in short.candidates)


def test_between_grid_points_the_table_interpolates_in_log_sizes():
    """Half way (in log2) between two kv points, a backend's time is the geometric mean of its two."""
    p = make_problem(entry="xqa_batch_decode_with_kv_cache", phase="decode", num_qo_heads=32, num_kv_heads=8,
                     head_dim_qk=128, head_dim_vo=128, device_type="cuda")
    table = synthetic_table(p, {"xqa": 1.0, "fa2": 1.0})
    names, cells = table.data["backends"], table.data["keys"][key_of(p)]
    for b in (16, 64):  # batch 24 -> middle 18: between 16 and 64
        cells[f"{b},1,1024"] = f"{names.index('xqa')} 0.1 {names.index('fa2')} 0.2"
        cells[f"{b},1,4096"] = f"{names.index('xqa')} 0.4 {names.index('fa2')} 0.2"
    times, shown = table.gpu_ms(p, (32, 1, 2048))  # middle 24 x 1 x 1536: 1536 is 0.29 of the way in log2
    t = math.log2(1536 / 1024) / 2
    assert shown == (24, 1, 1536)
    assert times["xqa"] == pytest.approx(0.1 * 4 ** t) and times["fa2"] == pytest.approx(0.2)


def test_opening_a_context_forgets_the_entry_points_call_plans():
    """A bucket decided before the warm-up is decided again inside it: the entry points' call plans
    (which hold their decisions, and their lanes and launchers) go, not only the router's cache."""
    from dispatch.entries import _base
    from dispatch.benchmark.cases import ragged
    r = ragged()
    dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True)
    assert len(_base.PROOFS) > 0
    with autotune.autotune(True):
        assert len(_base.PROOFS) == 0 and len(_base.LANES) == 0


def test_opening_a_context_makes_planned_wrappers_decide_again(monkeypatch):
    """A planned wrapper's variants (each a decision and a backend plan) are forgotten too: its
    next run decides again, inside the context."""
    from dispatch.benchmark.cases import paged, paged_wrapper
    c = paged()
    w = paged_wrapper(c)
    expected = w.run(c["q"], c["cache"]).clone()
    assert len(w._variants) == 1
    decided = []
    real = router.decide
    monkeypatch.setattr(router, "decide", lambda *a, **k: decided.append(1) or real(*a, **k))
    with autotune.autotune(True):
        assert len(w._variants) == 0
        assert torch.equal(w.run(c["q"], c["cache"]), expected) and decided == [1]


@pytest.mark.parametrize("phase, q_len", [("prefill", 3), ("decode", 1)])
def test_autotune_times_a_custom_mask_problem_with_its_mask(phase, q_len):
    """The timing inputs carry the mask the problem declares (on the H200 every custom-mask bucket
    failed on native-triton and the reference, and fa2 was timed without its mask)."""
    p = make_problem(phase=phase, mask="custom", q_dtype="float32", kv_dtype="float32", out_dtype="float32")
    timed = autotune.measure(p, ["reference"], (2, q_len, 40))["reference"]
    assert timed is not None and timed["ms"] > 0 and timed["tune_s"] > 0  # what the bucket's first call waited
    from dispatch.inputs import Case, make_batch
    batch = make_batch(Case("masked", p, (q_len, 5), (40, 3)), "cpu")
    assert batch.custom_mask.dtype == torch.bool and batch.mask_indptr.tolist() == [0, q_len * 40, q_len * 40 + 15]
    own = batch.custom_mask[q_len * 40:].reshape(5, 3)[torch.arange(5), (torch.arange(5) - 2).clamp(min=0)]
    assert own.all()  # each query keeps its own key (bottom-right; 5 queries on 3 keys clamp to key 0)


def test_autotune_host_time_is_the_launchers_an_eager_repeat_calls(monkeypatch):
    calls = {"launch": 0, "run": 0}

    class Backend:
        def launcher(self, plan, batch):
            return lambda b: calls.__setitem__("launch", calls["launch"] + 1)

        def run(self, plan, batch):
            calls["run"] += 1
        def plan_reusable(self, problem):
            return False  # a wrapper's runs repeat its plan whatever the backend says
    monkeypatch.setattr(autotune.torch.cuda, "synchronize", lambda: None)
    assert autotune._host_us(Backend(), decode_problem(), None, None) > 0
    assert calls == {"launch": 1 + 3 * autotune.HOST_CALLS, "run": 0}  # a warm call, three timed rounds


def test_autotune_inputs_carry_xqa_draft_bits_for_a_spec_bits_problem():
    from dispatch.inputs import Case, make_batch
    p = make_problem(phase="spec_decode", mask="spec_bits", q_dtype="float32", kv_dtype="float32", out_dtype="float32")
    batch = make_batch(Case("drafts", p, (3, 3), (20, 9)), "cpu")
    assert batch.spec_mask.dtype == torch.uint16 and batch.spec_mask.shape[0] == 6
    words = batch.spec_mask.view(torch.int32)[:, 0]  # row i of a request: drafts 0..i (causal)
    assert words.tolist() == [1, 3, 7, 1, 3, 7]


def test_a_backend_a_corner_left_out_counts_as_keep_within_times_its_fastest():
    """A corner keeps only backends within ``keep_within`` of its fastest: one it left out is at least
    that slow there, whichever corner the interpolation reads first."""
    p = make_problem(entry="xqa_batch_decode_with_kv_cache", phase="decode", num_qo_heads=32, num_kv_heads=8,
                     head_dim_qk=128, head_dim_vo=128, device_type="cuda")
    table = synthetic_table(p, {"xqa": 1.0, "fa2": 1.0})
    names, cells = table.data["backends"], table.data["keys"][key_of(p)]
    for b in (16, 64):
        cells[f"{b},1,1024"] = f"{names.index('xqa')} 0.1"  # fa2 left out here only
        cells[f"{b},1,4096"] = f"{names.index('xqa')} 0.4 {names.index('fa2')} 0.2"
    times, _ = table.gpu_ms(p, (32, 1, 2048))
    t = math.log2(1536 / 1024) / 2
    keep = table.data.get("keep_within", 2.5)
    assert times["fa2"] == pytest.approx((0.1 * keep) ** (1 - t) * 0.2 ** t)
    assert times["xqa"] == pytest.approx(0.1 ** (1 - t) * 0.4 ** t)


def test_a_graph_weighs_the_measured_times_of_every_kv_bucket_it_replays(monkeypatch):
    """A graph with a replay bound is decided by the mean of its times over the kv buckets it replays
    (each timed inside the context), as from the table; an eager call by its own bucket. Outside the
    context, a graph whose buckets were not all timed is decided by the table."""
    by_kv = {"xqa": {48: 0.05, 192: 0.05, 768: 0.05, 3072: 0.06, 12288: 0.20},  # the faster at kv 4096 (3072)
             "fa2": {48: 0.01, 192: 0.012, 768: 0.03, 3072: 0.08, 12288: 0.25}}  # the faster over 64..16384
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *_: {n: by_kv[n][sizes[2]] for n in names})
    eager = decode_problem(sizes=(8, 1, 4096))
    graph = decode_problem(sizes=(8, 1, 4096), cuda_graph=True, replay_kv=16384)
    with autotune.autotune(True):
        assert choice.rank(eager, H100, ["xqa", "fa2"], eager.sizes).order[0] == "xqa"
        ranking = choice.rank(graph, H100, ["xqa", "fa2"], graph.sizes)
    assert ranking.order == ["fa2", "xqa"] and "the mean over the kv buckets it replays up to 16384" in ranking.basis
    assert ranking.estimates["fa2"].ms == pytest.approx((0.01 + 0.012 + 0.03 + 0.08 + 0.25) / 5)
    longer = decode_problem(sizes=(8, 1, 4096), cuda_graph=True, replay_kv=65536)  # kv 65536 never timed
    assert not choice.rank(longer, H100, ["xqa", "fa2"], longer.sizes).basis.startswith("measured here")


def test_an_eager_warm_up_call_with_a_kv_bound_times_what_its_capture_replays(monkeypatch):
    """The warm-up runs eagerly and the engine captures afterwards, where nothing is timed: an eager
    decision with a replay bound inside the context times the kv buckets a graph of it replays, so
    the capture's decision (lookups only) finds them all."""
    by_kv = {"xqa": {48: 0.05, 192: 0.05, 768: 0.05, 3072: 0.06, 12288: 0.20},
             "fa2": {48: 0.01, 192: 0.012, 768: 0.03, 3072: 0.08, 12288: 0.25}}
    monkeypatch.setattr(autotune, "measure", lambda problem, names, sizes, *_: {n: by_kv[n][sizes[2]] for n in names})
    eager = decode_problem(sizes=(8, 1, 16384), replay_kv=16384)  # a call whose kv length bound is 16384
    with autotune.autotune(True):
        choice.rank(eager, H100, ["xqa", "fa2"], eager.sizes)
    never_measure(monkeypatch)
    monkeypatch.setattr(choice, "capturing", lambda device: True)  # the capture after the warm-up
    captured = choice.rank(eager, H100, ["xqa", "fa2"], eager.sizes)
    assert captured.basis.startswith("measured here") and captured.order == ["fa2", "xqa"]
