"""Router and policy behaviour with fake vendor backends (CPU tensors, no vendor package).

Fake backends are registered into ``backends.REGISTRY`` / ``backends._INSTANCES`` and a
priority list is patched into ``capability_db.candidates``; every test clears the router's
caches so a decision never leaks from one test into the next.
"""
from __future__ import annotations

import logging
import math

import pytest
import torch

import backends
import capability_db
import dispatch
from backends import Backend, BackendRejected, DeviceDesc, Reason
from capability_db.schema import PriorityEntry
from dispatch import policy, router
from dispatch.problem import AttentionBatch, AttentionProblem

FAKE_GPU = DeviceDesc(name="fake-gpu", kind="cuda", sm=90, family="hopper", fp8=True)
HQ, HKV, D, Q_LEN, KV_LEN = 4, 2, 16, 5, 9


class FakeBackend(Backend):
    """A configurable vendor stand-in; it records every call the router makes."""

    def __init__(self, name, reasons=(), missing=None, plan_error=None, run_error=None):
        self.name = name
        self.reasons, self.missing = list(reasons), missing
        self.plan_error, self.run_error = plan_error, run_error
        self.calls = {"check": 0, "plan": 0, "run": 0}

    def available(self):
        return self.missing

    def check(self, problem, device):
        self.calls["check"] += 1
        return list(self.reasons)

    def plan(self, problem, batch):
        self.calls["plan"] += 1
        if self.plan_error is not None:
            raise self.plan_error
        return {"scale": 1.0 / math.sqrt(problem.head_dim_qk)}

    def run(self, plan, batch):
        self.calls["run"] += 1
        if self.run_error is not None:
            raise self.run_error
        batch.out.copy_(_attention_fp32(batch.q, batch.k, batch.v, plan["scale"]).to(batch.out.dtype))


def _attention_fp32(q, k, v, scale):
    """Non-causal single-request attention with GQA, in fp32 (what the fakes compute)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _oracle_fp64(q, k, v, scale):
    """Independent fp64 oracle: explicit max-subtracted exponentials per head."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for h in range(q.shape[1]):
        kh = h // (q.shape[1] // k.shape[1])
        s = q[:, h] @ k[:, kh].T * scale
        p = torch.exp(s - s.max(dim=1, keepdim=True).values)
        out[:, h] = (p / p.sum(dim=1, keepdim=True)) @ v[:, kh]
    return out


@pytest.fixture
def fakes(monkeypatch):
    """Install fakes by name; returns a function that installs and orders them."""
    import backends

    def install(*fake_backends, unranked=()):
        """The fakes are the whole registry; ``unranked`` ones are registered but in no priority list."""
        registry = {fb.name: "tests.test_router:FakeBackend" for fb in (*fake_backends, *unranked)}
        monkeypatch.setattr(backends, "REGISTRY", registry)
        for fb in (*fake_backends, *unranked):
            monkeypatch.setitem(backends._INSTANCES, fb.name, fb)
        order = [PriorityEntry(backend=fb.name, why=f"fake priority {i}") for i, fb in enumerate(fake_backends)]
        monkeypatch.setattr(capability_db, "candidates", lambda device, phase, entry: list(order))
        monkeypatch.setattr(policy, "BACKEND_NAMES", tuple(capability_db.BACKEND_NAMES) + tuple(registry))
        return fake_backends + tuple(unranked)

    monkeypatch.delenv(policy.ENV_BACKEND, raising=False)
    monkeypatch.delenv(policy.ENV_STRICT, raising=False)
    router.clear_caches()
    yield install
    router.clear_caches()


def make_problem(**overrides) -> AttentionProblem:
    fields = dict(entry="test_router", phase="prefill", kv_storage="dense", kv_layout="NHD",
                  num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=D, head_dim_vo=D,
                  q_dtype="float32", kv_dtype="float32", out_dtype="float32", device_type="cpu")
    fields.update(overrides)
    return AttentionProblem(**fields)


def make_batch(seed: int = 0) -> AttentionBatch:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(Q_LEN, HQ, D, generator=gen)
    k = torch.randn(KV_LEN, HKV, D, generator=gen)
    v = torch.randn(KV_LEN, HKV, D, generator=gen)
    out = torch.full((Q_LEN, HQ, D), float("nan"))  # poisoned: every element must be written
    return AttentionBatch(q=q, k=k, v=v, qo_indptr=torch.tensor([0, Q_LEN], dtype=torch.int32),
                          kv_lens=torch.tensor([KV_LEN], dtype=torch.int32), out=out, batch_size=1,
                          max_q_len=Q_LEN, max_kv_len=KV_LEN, sm_scale=1.0 / math.sqrt(D),
                          kv_indptr=torch.tensor([0, KV_LEN], dtype=torch.int32))


def assert_matches_oracle(batch: AttentionBatch) -> None:
    assert not torch.isnan(batch.out).any(), "some output elements were never written"
    ref = _oracle_fp64(batch.q, batch.k, batch.v, 1.0 / math.sqrt(D))
    err = (batch.out.double() - ref).norm() / ref.norm()
    assert err < 1e-5, f"relative Frobenius error {err:.2e} >= 1e-5 (fp32 band)"


HEAD_DIM_REASON = Reason("head_dim_qk", 16, "one of 64, 128", "fake datasheet")


# -- explicit choice: honoured or refused with its reasons, never replaced ------------------
def test_explicit_argument_refused_with_that_backends_reasons(fakes):
    fakes(FakeBackend("fake-fast"), FakeBackend("fake-picky", reasons=[HEAD_DIM_REASON]))
    explicit = policy.explicit_choice("fake-picky")
    assert explicit == ("fake-picky", "backend= argument")
    with pytest.raises(router.BackendRefusedError) as info:
        router.decide(make_problem(), FAKE_GPU, explicit=explicit)
    text = str(info.value)
    assert "'fake-picky' (chosen by backend= argument)" in text
    assert "head_dim_qk=16: allowed one of 64, 128 [fake datasheet]" in text
    assert "backends that would accept it: fake-fast" in text


def test_use_backend_context_manager_is_an_explicit_choice_and_is_restored(fakes):
    fakes(FakeBackend("fake-fast"), FakeBackend("fake-picky", reasons=[HEAD_DIM_REASON]))
    with dispatch.use_backend("fake-picky"):
        explicit = policy.explicit_choice()
        assert explicit == ("fake-picky", "dispatch.use_backend()")
        with pytest.raises(router.BackendRefusedError, match=r"chosen by dispatch\.use_backend\(\)"):
            router.decide(make_problem(), FAKE_GPU, explicit=explicit)
    assert policy.explicit_choice() is None


def test_env_backend_is_an_explicit_choice(fakes, monkeypatch):
    fakes(FakeBackend("fake-fast"), FakeBackend("fake-picky", reasons=[HEAD_DIM_REASON]))
    monkeypatch.setenv(policy.ENV_BACKEND, "fake-picky")
    explicit = policy.explicit_choice()
    assert explicit == ("fake-picky", policy.ENV_BACKEND)
    with pytest.raises(router.BackendRefusedError, match=f"chosen by {policy.ENV_BACKEND}"):
        router.decide(make_problem(), FAKE_GPU, explicit=explicit)


def test_explicit_choice_precedence_argument_then_context_then_env(fakes, monkeypatch):
    fakes(FakeBackend("fake-a"), FakeBackend("fake-b"), FakeBackend("fake-c"))
    monkeypatch.setenv(policy.ENV_BACKEND, "fake-c")
    assert policy.explicit_choice() == ("fake-c", policy.ENV_BACKEND)
    with dispatch.use_backend("fake-b"):
        assert policy.explicit_choice() == ("fake-b", "dispatch.use_backend()")
        assert policy.explicit_choice("fake-a") == ("fake-a", "backend= argument")
        assert policy.explicit_choice("auto") == ("fake-b", "dispatch.use_backend()")


@pytest.mark.parametrize("spelling, canonical", [("trtllm", "trtllm-gen"), ("triton", "native-triton"),
                                                 ("cudnn", "cudnn"), ("auto", None)])
def test_backend_name_aliases(spelling, canonical):
    assert policy.normalize_backend_name(spelling) == canonical


def test_unknown_backend_names_list_the_valid_options(monkeypatch):
    monkeypatch.delenv(policy.ENV_BACKEND, raising=False)
    with pytest.raises(ValueError) as info:
        policy.explicit_choice("flash-magic")
    assert "backend='flash-magic'" in str(info.value)
    assert all(name in str(info.value) for name in capability_db.BACKEND_NAMES)
    with pytest.raises(ValueError, match=r"use_backend='nope'.*valid options are: auto, cudnn"):
        with dispatch.use_backend("nope"):
            pass
    monkeypatch.setenv(policy.ENV_BACKEND, "nope")
    with pytest.raises(ValueError, match=f"{policy.ENV_BACKEND}='nope'"):
        policy.explicit_choice()
    import backends
    with pytest.raises(ValueError, match="valid options are: cudnn, trtllm-gen"):
        backends.get_backend("nope")


def test_explicit_choice_accepted_even_below_a_preferred_backend(fakes):
    fast, slow = fakes(FakeBackend("fake-fast"), FakeBackend("fake-slow"))
    decision = router.decide(make_problem(), FAKE_GPU, explicit=("fake-slow", "backend= argument"))
    assert decision.chosen == "fake-slow"
    batch = make_batch()
    planned = router.run(router.plan(decision, batch), batch)
    assert planned.backend == "fake-slow" and fast.calls["plan"] == fast.calls["run"] == 0
    assert_matches_oracle(batch)


def test_explicit_choice_rejected_at_plan_time_is_not_silently_replaced(fakes):
    refusal = BackendRejected("fake-slow", [Reason("graph", "not supported", "a supported graph")])
    fast, slow = fakes(FakeBackend("fake-fast"), FakeBackend("fake-slow", plan_error=refusal))
    decision = router.decide(make_problem(), FAKE_GPU, explicit=("fake-slow", "backend= argument"))
    with pytest.raises(router.BackendRefusedError, match="no fallback under an explicit choice"):
        router.plan(decision, make_batch())
    assert fast.calls["plan"] == 0 and decision.fallbacks == []


# -- fallback: plan-time rejection hands over, logged once, recorded ----------------------------
def test_plan_time_rejection_falls_back_logged_once_and_recorded(fakes, caplog):
    refusal = BackendRejected("fake-vendor", [Reason("graph", "not supported", "a supported cuDNN graph")])
    vendor, native = fakes(FakeBackend("fake-vendor", plan_error=refusal), FakeBackend("fake-native"))
    caplog.set_level(logging.INFO, logger="attn_dispatch")
    decision = router.decide(make_problem(), FAKE_GPU)
    assert decision.chosen == "fake-vendor"
    for seed in (1, 2):
        batch = make_batch(seed)
        planned = router.run(router.plan(decision, batch), batch)
        assert planned.backend == "fake-native"
        assert_matches_oracle(batch)
    warnings = [r for r in caplog.records if r.name == "attn_dispatch" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "fake-vendor refused" in warnings[0].getMessage() and "a supported cuDNN graph" in warnings[0].getMessage()
    assert decision.fallbacks == [("fake-vendor", refusal.reasons)]
    assert "fallback: fake-vendor refused at plan time" in decision.explain()
    assert decision.to_json()["fallbacks"][0]["backend"] == "fake-vendor"


def test_rejection_raised_by_run_before_launch_falls_back(fakes):
    refusal = BackendRejected("fake-vendor", [Reason("cubin", "missing", "a shipped kernel")])
    vendor, native = fakes(FakeBackend("fake-vendor", run_error=refusal), FakeBackend("fake-native"))
    decision = router.decide(make_problem(), FAKE_GPU)
    batch = make_batch(3)
    planned = router.run(router.plan(decision, batch), batch)
    assert planned.backend == "fake-native" and native.calls["run"] == 1
    assert decision.fallbacks == [("fake-vendor", refusal.reasons)]
    assert_matches_oracle(batch)


def test_error_after_launch_propagates_and_is_not_retried(fakes):
    vendor, native = fakes(FakeBackend("fake-vendor", run_error=RuntimeError("illegal memory access")),
                           FakeBackend("fake-native"))
    decision = router.decide(make_problem(), FAKE_GPU)
    batch = make_batch()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        router.run(router.plan(decision, batch), batch)
    assert vendor.calls["run"] == 1
    assert native.calls["plan"] == native.calls["run"] == 0
    assert decision.fallbacks == []


def test_no_accepting_backend_lists_every_backends_reasons(fakes):
    fakes(FakeBackend("fake-a", reasons=[HEAD_DIM_REASON]),
          FakeBackend("fake-b", reasons=[Reason("page_size", 16, "a multiple of 256")]))
    with pytest.raises(router.NoBackendError) as info:
        router.decide(make_problem(), FAKE_GPU)
    text = str(info.value)
    assert "fake-a:" in text and "head_dim_qk=16" in text
    assert "fake-b:" in text and "page_size=16: allowed a multiple of 256" in text


# -- strict mode: every fallback is an error ----------------------------------------------------
@pytest.mark.parametrize("how", ["env", "context"])
def test_strict_refuses_a_check_time_fallback(fakes, monkeypatch, how):
    fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), FakeBackend("fake-native"))
    assert router.decide(make_problem(), FAKE_GPU, strict=False).chosen == "fake-native"
    if how == "env":
        monkeypatch.setenv(policy.ENV_STRICT, "1")
        assert policy.strict_mode()
        with pytest.raises(router.NoBackendError, match="strict mode.*fake-vendor would fall back to fake-native"):
            router.decide(make_problem(), FAKE_GPU)
    else:
        with dispatch.strict():
            assert policy.strict_mode()
            with pytest.raises(router.NoBackendError, match="head_dim_qk=16"):
                router.decide(make_problem(), FAKE_GPU)
        assert not policy.strict_mode()


@pytest.mark.parametrize("how", ["env", "context"])
def test_strict_refuses_a_plan_time_fallback(fakes, monkeypatch, how):
    refusal = BackendRejected("fake-vendor", [Reason("graph", "not supported", "a supported graph")])
    vendor, native = fakes(FakeBackend("fake-vendor", plan_error=refusal), FakeBackend("fake-native"))
    if how == "env":
        monkeypatch.setenv(policy.ENV_STRICT, "1")
        decision = router.decide(make_problem(), FAKE_GPU)
    else:
        with dispatch.strict():
            decision = router.decide(make_problem(), FAKE_GPU)
    assert decision.strict
    with pytest.raises(router.BackendRefusedError, match="no fallback under strict mode"):
        router.plan(decision, make_batch())
    assert native.calls["plan"] == 0


def test_strict_does_not_count_a_missing_package_as_a_fallback(fakes):
    missing = Reason("package fakevendor", "not installed", "pip install 'attn-dispatch[fakevendor]'")
    fakes(FakeBackend("fake-vendor", missing=missing), FakeBackend("fake-native"))
    decision = router.decide(make_problem(), FAKE_GPU, strict=True, live=True)
    assert decision.chosen == "fake-native"
    assert decision.candidates[0].reasons == [missing]


def test_live_false_ignores_installation(fakes):
    missing = Reason("package fakevendor", "not installed", "pip install 'attn-dispatch[fakevendor]'")
    fakes(FakeBackend("fake-vendor", missing=missing), FakeBackend("fake-native"))
    assert router.decide(make_problem(), FAKE_GPU, live=False).chosen == "fake-vendor"
    assert router.decide(make_problem(), FAKE_GPU, live=True).chosen == "fake-native"


# -- decisions are cached per key ------------------------------------------------------------
def test_decision_cached_per_problem_key(fakes):
    vendor, native = fakes(FakeBackend("fake-vendor"), FakeBackend("fake-native"))
    first = router.decide(make_problem(), FAKE_GPU)
    second = router.decide(make_problem(), FAKE_GPU)  # an equal, separately built key
    assert second is first
    assert vendor.calls["check"] == 1 and native.calls["check"] == 1
    other = router.decide(make_problem(causal=True), FAKE_GPU)
    assert other is not first and vendor.calls["check"] == 2
    router.clear_caches()
    router.decide(make_problem(), FAKE_GPU)
    assert vendor.calls["check"] == 3


def test_a_new_size_class_is_decided_without_checking_the_backends_again(fakes):
    vendor, native = fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), FakeBackend("fake-native"))
    small = router.decide(make_problem(sizes=(1, 8, 16)), FAKE_GPU)
    large = router.decide(make_problem(sizes=(64, 512, 4096)), FAKE_GPU)  # another size class: decided anew
    assert large is not small and large.chosen == small.chosen == "fake-native"
    assert vendor.calls["check"] == native.calls["check"] == 1  # checks read facts, never sizes
    assert [c.reasons for c in large.candidates] == [c.reasons for c in small.candidates] == [[HEAD_DIM_REASON], []]
    router.decide(make_problem(sizes=(1, 8, 16), causal=True), FAKE_GPU)  # another fact: checked
    assert vendor.calls["check"] == 2


def test_decision_log_is_emitted_once_per_key(fakes, caplog):
    fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), FakeBackend("fake-native"))
    caplog.set_level(logging.INFO, logger="attn_dispatch")
    for _ in range(3):
        router.decide(make_problem(), FAKE_GPU)
    infos = [r for r in caplog.records if r.name == "attn_dispatch" and r.levelno == logging.INFO]
    assert len(infos) == 1 and "-> fake-native" in infos[0].getMessage()
    assert "fake-vendor (rejected)" in infos[0].getMessage()


def test_explain_and_json_show_every_candidate_with_its_reasons(fakes):
    fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), FakeBackend("fake-native"))
    decision = router.decide(make_problem(), FAKE_GPU)
    text = decision.explain()
    assert "rejected fake-vendor" in text and "head_dim_qk=16: allowed one of 64, 128" in text
    assert "CHOSEN   fake-native" in text and "fake priority 1" in text
    data = decision.to_json()
    assert data["chosen"] == "fake-native"
    assert [c["accepted"] for c in data["candidates"]] == [False, True]
    assert [c["ranked"] for c in data["candidates"]] == [True, True]


# -- backends outside the priority list: shown, never chosen, can be forced ----------------------
def test_unranked_backends_are_listed_after_the_ranked_ones_with_their_reasons(fakes):
    fakes(FakeBackend("fake-native"), unranked=[FakeBackend("fake-outsider", reasons=[HEAD_DIM_REASON]),
                                               FakeBackend("fake-spare")])
    decision = router.decide(make_problem(), FAKE_GPU)
    assert [c.backend for c in decision.candidates] == ["fake-native", "fake-outsider", "fake-spare"]
    assert [c.ranked for c in decision.candidates] == [True, False, False]
    assert decision.candidates[1].why == "not in the hopper/prefill priority list"
    assert decision.candidates[1].reasons == [HEAD_DIM_REASON]
    assert decision.chosen == "fake-native" and decision.accepted() == ["fake-native"]
    text = decision.explain()
    assert "ok       fake-spare     not in the hopper/prefill priority list" in text
    assert "head_dim_qk=16: allowed one of 64, 128" in text


def test_an_accepting_unranked_backend_is_never_a_fallback(fakes):
    native, spare = fakes(FakeBackend("fake-native", plan_error=BackendRejected("fake-native", [HEAD_DIM_REASON])),
                          unranked=[FakeBackend("fake-spare")])
    decision = router.decide(make_problem(), FAKE_GPU)
    with pytest.raises(router.NoBackendError, match="every accepted backend refused"):
        router.plan(decision, make_batch())
    assert spare.calls["plan"] == 0


def test_nothing_ranked_accepts_but_an_unranked_one_says_how_to_force_it(fakes):
    fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), unranked=[FakeBackend("fake-spare")])
    with pytest.raises(router.NoBackendError) as info:
        router.decide(make_problem(), FAKE_GPU)
    text = str(info.value)
    assert "fake-spare: (not in the hopper/prefill priority list)" in text
    assert f"force it with backend='fake-spare' or {policy.ENV_BACKEND}=fake-spare" in text


def test_an_unranked_backend_can_be_forced(fakes):
    fakes(FakeBackend("fake-vendor", reasons=[HEAD_DIM_REASON]), unranked=[FakeBackend("fake-spare")])
    decision = router.decide(make_problem(), FAKE_GPU, explicit=("fake-spare", "backend= argument"))
    batch = make_batch()
    planned = router.run(router.plan(decision, batch), batch)
    assert planned.backend == "fake-spare"
    assert_matches_oracle(batch)


def test_a_refused_explicit_choice_names_unranked_backends_that_would_accept(fakes):
    fakes(FakeBackend("fake-picky", reasons=[HEAD_DIM_REASON]), unranked=[FakeBackend("fake-spare")])
    with pytest.raises(router.BackendRefusedError, match="backends that would accept it: fake-spare"):
        router.decide(make_problem(), FAKE_GPU, explicit=("fake-picky", "backend= argument"))


def test_explain_lines_fit_100_columns(fakes):
    long_why = Reason("head_dim_qk", 16, "one of " + ", ".join(str(16 * i) for i in range(4, 40)), "a long datasheet " * 8)
    fakes(FakeBackend("fake-vendor", reasons=[long_why]), FakeBackend("fake-native"))
    decision = router.decide(make_problem(), FAKE_GPU)
    for text in (decision.explain(), decision.explain(verbose=True)):
        assert max(len(line) for line in text.splitlines()) <= router.WIDTH
    assert "a long datasheet" in decision.explain(verbose=True) and "a long datasheet" not in decision.explain()


# -- ATTN_DISPATCH_STRICT: a boolean, parsed strictly ---------------------------------------------
@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "Yes", "on", "ON", " on "])
def test_strict_env_on(monkeypatch, value):
    monkeypatch.setenv(policy.ENV_STRICT, value)
    assert policy.strict_mode() is True


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "no", "No", "off", "OFF", ""])
def test_strict_env_off(monkeypatch, value):
    monkeypatch.setenv(policy.ENV_STRICT, value)
    assert policy.strict_mode() is False


def test_strict_env_unset_is_off(monkeypatch):
    monkeypatch.delenv(policy.ENV_STRICT, raising=False)
    assert policy.strict_mode() is False


@pytest.mark.parametrize("value", ["2", "maybe", "enable", "tru"])
def test_strict_env_other_values_name_the_variable_value_and_options(monkeypatch, value):
    monkeypatch.setenv(policy.ENV_STRICT, value)
    with pytest.raises(ValueError) as info:
        policy.strict_mode()
    text = str(info.value)
    assert f"{policy.ENV_STRICT}={value!r}" in text
    assert all(word in text for word in ("1", "true", "yes", "on", "0", "false", "no", "off"))


def test_strict_context_manager_wins_over_a_bad_env_value(monkeypatch):
    monkeypatch.setenv(policy.ENV_STRICT, "maybe")
    with dispatch.strict(False):
        assert policy.strict_mode() is False


def test_reference_on_a_cuda_device_warns_once_naming_every_other_candidates_reasons(caplog):
    """The slow reference serving a CUDA problem (head dim 1024: nothing else accepts it) is logged
    once per (problem, device) as a WARNING carrying each other candidate's reasons, even when the
    decision is made again; on the CPU, where the reference is the plan, nothing is logged."""
    from dataclasses import replace

    from dispatch.benchmark.vendors import make_problem

    h100 = capability_db.resolve_device("h100")
    router.clear_caches()
    p = make_problem(phase="decode", head_dim_qk=1024, head_dim_vo=1024, device_type="cuda")
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"):
        assert router.decide(p, h100, live=False).chosen == "reference"
        router._decisions.clear()  # a fresh decision of the same problem on the same GPU
        assert router.decide(p, h100, live=False).chosen == "reference"
        cpu = replace(p, device_type="cpu")
        assert router.decide(cpu, capability_db.CPU_DEVICE, live=False).chosen == "reference"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    others = [c for c in router.evaluate(p, h100, live=False) if c.ranked and c.backend != "reference"]
    assert others and "slow PyTorch reference" in warnings[0] and h100.name in warnings[0]
    for c in others:
        assert f"{c.backend}: " in warnings[0] and c.reasons and str(c.reasons[0]) in warnings[0], c.backend


def test_fa2_refuses_alibi_with_a_soft_cap_and_serves_each_alone():
    """Both fa2 providers compute another function than the convention cap * tanh((sm_scale * q.k +
    bias) / cap) when ALiBi and a soft cap meet (FlashInfer scales by sm_scale twice, flash-attn caps
    before the bias): refused by name there, each alone served; the reference serves the pair."""
    h100 = capability_db.resolve_device("h100")
    gpu = dict(device_type="cuda", q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16", head_dim_qk=128,
               head_dim_vo=128)
    both = make_problem(pos_encoding="ALIBI", logits_soft_cap=30.0, **gpu)
    reasons = backends.get_backend("fa2").check(both, h100)
    assert [r.field for r in reasons] == ["has_soft_cap"] and "with ALiBi" in str(reasons[0]), reasons
    assert backends.get_backend("fa2").check(make_problem(pos_encoding="ALIBI", **gpu), h100) == []
    assert backends.get_backend("fa2").check(make_problem(logits_soft_cap=30.0, **gpu), h100) == []
    assert backends.get_backend("reference").check(make_problem(pos_encoding="ALIBI", logits_soft_cap=30.0), capability_db.CPU_DEVICE) == []
