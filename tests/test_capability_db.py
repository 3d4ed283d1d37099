"""The capability data: it loads, every fact exists and has a source, priorities and devices are
complete, and the data never over-promises (vendor facts that must be refused are refused).

``MUST_REJECT`` is the hook the project extends: one row per vendor fact (from the vendor's
documentation or source) that a backend's data must refuse.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
import typing
from pathlib import Path

import pytest

import capability_db
from backends import get_backend
from capability_db.schema import DEVICE_FACTS, RELATIONS, BackendCaps, Constraint
from capability_db import vocabulary as problem_module
from dispatch.problem import DTYPE_NAMES, AttentionProblem

REPO_ROOT = Path(capability_db.__file__).resolve().parent.parent
GPU_TAIL = ["native-triton", "reference"]
PHASES = ("prefill", "decode", "spec_decode")


def base_problem(**overrides) -> AttentionProblem:
    fields = dict(entry="test_capability_db", phase="prefill", kv_storage="paged", kv_layout="NHD",
                  num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_vo=128,
                  q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16", page_size=16, causal=True)
    fields.update(overrides)
    return AttentionProblem(**fields)


KNOWN_FACTS = set(base_problem().facts()) | set(DEVICE_FACTS)


def _literal_domains() -> dict[str, set]:
    """Fact -> its allowed values, for the Literal-typed fields of AttentionProblem."""
    hints = typing.get_type_hints(AttentionProblem, vars(problem_module))
    domains = {name: set(typing.get_args(tp)) for name, tp in hints.items() if typing.get_origin(tp) is typing.Literal}
    dtypes = set(DTYPE_NAMES.values()) | {"uint8"}  # uint8 = NVFP4 storage
    domains.update(q_dtype=dtypes, kv_dtype=dtypes, out_dtype=dtypes, device_kind={"cuda", "cpu"},
                   family={d.family for d in capability_db.device_table().devices} | {"cpu"})
    bools = [f.name for f in dataclasses.fields(AttentionProblem) if f.type in ("bool", bool)]
    domains.update({name: {True, False} for name in bools + ["has_window", "has_soft_cap", "same_head_dims",
                                                              "device_fp8", *RELATIONS]})
    return domains


DOMAINS = _literal_domains()
ALL_CAPS = [pytest.param(name, id=name) for name in capability_db.BACKEND_NAMES]


# -- files load and validate ---------------------------------------------------------------
def test_every_backend_file_exists_for_every_name_and_vice_versa():
    files = {p.stem for p in (capability_db.DATA_DIR / "backends").glob("*.json")}
    assert files == set(capability_db.BACKEND_NAMES)


@pytest.mark.parametrize("name", ALL_CAPS)
def test_backend_file_validates_fresh_from_disk(name):
    raw = json.loads((capability_db.DATA_DIR / "backends" / f"{name}.json").read_text())
    caps = BackendCaps.model_validate(raw)
    assert caps.name == name and caps.title.strip()
    assert caps.constraints, f"{name}: no constraints at all"
    assert caps == capability_db.backend_caps(name)


def test_devices_and_priorities_validate():
    assert capability_db.device_table().devices
    assert capability_db.priorities().families


def test_a_broken_file_names_itself(tmp_path, monkeypatch):
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "xqa.json").write_text('{"name": "xqa"}')
    monkeypatch.setattr(capability_db, "DATA_DIR", tmp_path)
    capability_db.backend_caps.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"backends/xqa\.json is invalid"):
            capability_db.backend_caps("xqa")
    finally:
        monkeypatch.undo()
        capability_db.backend_caps.cache_clear()


# -- a backend is declared once: its data file names its adapter, aliases, extra, install --------
VENDOR_MODULES = ("cudnn", "flashinfer", "flash_attn", "flash_attn_interface", "tensorrt_llm")
_IMPORT_ADAPTER = """
import builtins, importlib, json, sys
blocked = set(sys.argv[2].split(","))
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name.split(".")[0] in blocked:
        raise AssertionError(f"importing the adapter imported the vendor package {name!r}")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
module, cls = sys.argv[1].split(":")
print(json.dumps(getattr(importlib.import_module(module), cls).name))
"""


@pytest.mark.parametrize("name", ALL_CAPS)
def test_every_adapter_imports_without_a_vendor_package_and_has_the_files_name(name):
    """In a fresh interpreter, so that nothing imported earlier hides a vendor import."""
    import subprocess
    import sys

    adapter = capability_db.backend_caps(name).adapter
    done = subprocess.run([sys.executable, "-c", _IMPORT_ADAPTER, adapter, ",".join(VENDOR_MODULES)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{name}: adapter {adapter!r} failed to import:\n{done.stderr[-2000:]}"
    assert json.loads(done.stdout.strip().splitlines()[-1]) == name


def test_the_registry_and_aliases_are_read_from_the_data_files():
    import backends
    from dispatch import policy

    assert backends.REGISTRY == {c.name: c.adapter for c in capability_db.all_backend_caps()}
    assert list(backends.REGISTRY) == list(capability_db.BACKEND_NAMES)
    for caps in capability_db.all_backend_caps():
        for alias in caps.aliases:
            assert policy.normalize_backend_name(alias) == caps.name
            assert get_backend(alias) is get_backend(caps.name)


def test_aliases_are_unique_and_never_a_backend_name():
    spellings = [a for c in capability_db.all_backend_caps() for a in c.aliases]
    assert len(spellings) == len(set(spellings)), spellings
    assert not set(spellings) & (set(capability_db.BACKEND_NAMES) | {"auto"})


def test_an_alias_naming_two_backends_is_refused(monkeypatch):
    real = capability_db.all_backend_caps()
    clash = [real[0].model_copy(update={"aliases": ["dup"]}), real[1].model_copy(update={"aliases": ["dup"]})]
    monkeypatch.setattr(capability_db, "all_backend_caps", lambda: clash)
    capability_db.backend_aliases.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=f"alias 'dup' already names {real[0].name!r}"):
            capability_db.backend_aliases()
    finally:
        monkeypatch.undo()
        capability_db.backend_aliases.cache_clear()


def _pyproject_extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", ALL_CAPS)
def test_every_extra_the_data_names_is_a_pyproject_extra(name):
    caps = capability_db.backend_caps(name)
    extras = _pyproject_extras()
    named = {caps.extra} | {p.extra for p in caps.providers}
    assert named - {None, ""} <= set(extras), f"{name}: extras {named} vs pyproject {sorted(extras)}"
    if caps.extra:
        assert f"pip install 'attn-dispatch[{caps.extra}]'" in caps.install
    for p in caps.providers:  # the package an extra installs is the one whose module the adapter imports
        if p.extra:
            dists = " ".join(extras[p.extra])
            assert DISTRIBUTION[p.module.split(".")[0]] in dists, (name, p.module, dists)


# module the adapters import -> the PyPI distribution that provides it
DISTRIBUTION = {"cudnn": "nvidia-cudnn-frontend", "flashinfer": "flashinfer-python", "triton": "triton"}


def test_no_extra_installs_a_package_no_adapter_imports():
    extras = _pyproject_extras()
    used = {p.extra for c in capability_db.all_backend_caps() for p in c.providers} | {
        c.extra for c in capability_db.all_backend_caps()}
    for extra in set(extras) - {"test", "all", "bench", "transformers"}:  # transformers: dispatch.integrations
        assert extra in used, f"pyproject extra [{extra}] serves no backend's data file"


def test_install_hint_for_a_missing_package_comes_from_the_data():
    from backends.base import import_reason

    reason = import_reason("flashinfer", ModuleNotFoundError("No module named 'flashinfer'"))
    assert reason.value == "not installed" and reason.allowed == "pip install 'attn-dispatch[flashinfer]'"
    assert "--no-build-isolation" in capability_db.install_hint("flash_attn")
    assert capability_db.install_hint("fa3") == capability_db.backend_caps("fa3").install


NOT_PUBLIC = ("vendor-constraints.md", "calling conventions", "/work/", "section 0.", "tools/results")


@pytest.mark.parametrize("name", ALL_CAPS)
def test_sources_cite_public_material_not_files_only_this_repository_has(name):
    caps = capability_db.backend_caps(name)
    texts = [c.source for c in caps.constraints] + [caps.cuda_graph_source, caps.parallelism_source,
                                                     caps.plans_per_call_source, caps.hardware.report]
    bad = [t for t in texts if any(word in t for word in NOT_PUBLIC)]
    assert not bad, f"{name}: {bad}"


def test_device_sources_cite_public_material():
    bad = [d.source for d in capability_db.device_table().devices if any(w in d.source for w in NOT_PUBLIC)]
    assert not bad, bad


# -- every constraint: a source, a known fact, values of the right kind ---------------------------
@pytest.mark.parametrize("name", ALL_CAPS)
def test_every_constraint_has_a_source(name):
    caps = capability_db.backend_caps(name)
    assert caps.cuda_graph_source.strip()
    for c in caps.constraints:
        assert c.source.strip(), f"{name}: constraint on {c.fact!r} has no source"


@pytest.mark.parametrize("name", ALL_CAPS)
def test_every_named_fact_exists(name):
    for c in capability_db.backend_caps(name).constraints:
        assert c.fact in KNOWN_FACTS, f"{name}: unknown fact {c.fact!r}; known: {sorted(KNOWN_FACTS)}"
        for key in c.when:
            assert key in KNOWN_FACTS, f"{name}: constraint on {c.fact!r} has unknown when-fact {key!r}"


@pytest.mark.parametrize("name", ALL_CAPS)
def test_listed_values_are_values_the_fact_can_take(name):
    """A typo ('bf16', 'paged_kv', 'Hopper') would silently never match."""
    for c in capability_db.backend_caps(name).constraints:
        listed = [(c.fact, v) for v in c.allowed or []] + [(k, v) for k, vs in c.when.items() for v in vs]
        for fact, value in listed:
            if fact in DOMAINS:
                assert value in DOMAINS[fact], f"{name}: {fact}={value!r} is not one of {sorted(map(str, DOMAINS[fact]))}"
            elif fact == "sm":
                assert isinstance(value, int) and value >= 70, f"{name}: sm={value!r} is not an SM number"


@pytest.mark.parametrize("name", ALL_CAPS)
def test_page_size_constraints_do_not_refuse_unpaged_problems(name):
    """page_size is 0 unless paged: an unconditional page-size rule would refuse ragged/dense."""
    caps = capability_db.backend_caps(name)
    for storage in ("ragged", "dense"):
        facts = base_problem(kv_storage=storage, page_size=0).facts()
        facts.update(sm=90, family="hopper", device_fp8=True, device_kind="cuda")
        if any(c.applies(facts) and not c.accepts(storage) for c in caps.facts_about("kv_storage")):
            continue  # the backend refuses this storage anyway: its page rule changes nothing
        for c in caps.facts_about("page_size"):
            if c.applies(facts) and not c.accepts(0):
                pytest.fail(f"{name}: page_size rule ({c.allowed_text()}) applies to {storage} KV (page_size 0); "
                            "add when: {kv_storage: [paged]}")


@pytest.mark.parametrize("name", ALL_CAPS)
def test_verified_hardware_claims_point_at_a_committed_report(name):
    hw = capability_db.backend_caps(name).hardware
    if hw.status in ("verified", "partial"):
        assert hw.where.strip(), f"{name}: hardware {hw.status!r} without where"
        assert hw.report.strip() and (REPO_ROOT / hw.report).exists(), (
            f"{name}: hardware {hw.status!r} needs a committed report; {hw.report!r} not found")


# -- priorities ---------------------------------------------------------------------------------
def test_priorities_name_known_backends_once_with_a_why():
    prio = capability_db.priorities()
    for family, phases in prio.families.items():
        for phase, entries in phases.items():
            names = [e.backend for e in entries]
            assert set(names) <= set(capability_db.BACKEND_NAMES), (family, phase, names)
            assert len(names) == len(set(names)), f"{family}/{phase} lists a backend twice: {names}"
            assert all(e.why.strip() for e in entries), (family, phase)
    for entry, ahead in prio.entry_first.items():
        names = [e.backend for e in ahead]
        assert set(names) <= set(capability_db.BACKEND_NAMES) and len(names) == len(set(names)), (entry, names)
        assert all(e.why.strip() for e in ahead), entry


def all_priority_entries() -> list:
    prio = capability_db.priorities()
    return [e for phases in prio.families.values() for entries in phases.values() for e in entries] + [
        e for ahead in prio.entry_first.values() for e in ahead]


def test_priority_provenance_is_in_the_source_and_points_at_what_exists():
    """A why says the reason in the product's terms; where its figures were measured goes into
    ``source``: public material, or the measurement (GPU, tool, date) with its summary in docs/."""
    entries = all_priority_entries()
    assert sum(bool(e.source) for e in entries) >= 14  # the H100 figures of the Hopper lists and entries
    for e in entries:
        assert ".md" not in e.why and not any(word in e.why for word in NOT_PUBLIC), e.why
        assert not any(word in e.source for word in NOT_PUBLIC), e.source
        for doc, anchor in re.findall(r"(docs/[\w.-]+\.md)#([\w-]+)", e.source):
            assert (REPO_ROOT / doc).exists(), e.source
            headings = re.findall(r"^#+ (.+)$", (REPO_ROOT / doc).read_text(), re.M)
            assert anchor in {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}, (
                f"{e.backend}: {doc} has no heading #{anchor}")
        if e.source and not e.source.startswith("https://"):
            assert "measured on" in e.source and "docs/benchmarks.md" in e.source, e.source


def test_every_family_has_every_phase_ending_with_the_safety_net():
    prio = capability_db.priorities()
    families = {d.family for d in capability_db.device_table().devices} | {"default", "cpu"}
    assert families <= set(prio.families), f"families without priorities: {families - set(prio.families)}"
    for family, phases in prio.families.items():
        assert set(PHASES) <= set(phases), f"{family} lacks {set(PHASES) - set(phases)}"
        for phase in PHASES:
            names = [e.backend for e in phases[phase]]
            tail = ["reference"] if family == "cpu" else GPU_TAIL
            assert names[-len(tail):] == tail, f"{family}/{phase} must end with {tail}: {names}"


# -- devices ------------------------------------------------------------------------------------
def test_devices_cover_the_architectures_we_route_for():
    sms = {d.sm for d in capability_db.device_table().devices}
    assert {80, 86, 89, 90, 100, 103, 120} <= sms
    archs = [d.arch for d in capability_db.device_table().devices]
    assert archs == [f"sm_{d.sm}" for d in capability_db.device_table().devices]


def test_device_names_are_unique_and_resolve_to_their_device():
    names = capability_db.device_names()
    assert len(names) == len(set(names)), "a device name is listed twice"
    for d in capability_db.device_table().devices:
        for name in [d.arch, *d.names]:
            desc = capability_db.resolve_device(name.upper())
            assert (desc.sm, desc.family, desc.fp8, desc.kind) == (d.sm, d.family, d.fp8, "cuda")
    assert capability_db.resolve_device("cpu") == capability_db.CPU_DEVICE


def test_unknown_device_lists_valid_options():
    with pytest.raises(ValueError, match=r"'tpu-v5' is not a known device; valid options are: sm_80, a100"):
        capability_db.resolve_device("tpu-v5")


def test_unknown_live_sm_keeps_the_nearest_family_below():
    desc = capability_db.device_for_capability(9, 5, "future hopper")
    assert (desc.sm, desc.family, desc.name) == (95, "hopper", "future hopper")


# -- the data never over-promises ------------------------------------------------------------------
# Checked through the adapter's check() (capability data + extra_checks): what routing sees.
# (backend, device, problem overrides of base_problem(), fields of which at least one must be
#  named by a Reason, the vendor fact). Extend freely: one row per vendor fact.
MUST_REJECT = [
    ("trtllm-gen", "h100", {}, {"sm"}, "SM100/103/107 only"),
    ("trtllm-gen", "rtx5090", {}, {"sm"}, "not SM120/121"),
    ("trtllm-gen", "thor", {}, {"sm"}, "not SM110"),
    ("trtllm-gen", "b200", {"kv_storage": "ragged", "page_size": 0}, {"kv_storage"}, "paged only"),
    ("trtllm-gen", "b200", {"page_size": 24}, {"page_size"}, "power of 2"),
    ("trtllm-gen", "b200", {"logits_soft_cap": 30.0}, {"has_soft_cap", "logits_soft_cap"}, "no soft cap"),
    ("trtllm-gen", "b200", {"causal": False, "window_left": 64}, {"has_window", "window_left", "causal"},
     "window only with causal"),
    ("trtllm-gen", "b200", {"head_dim_vo": 64}, {"same_head_dims", "head_dim_vo"}, "qk == vo"),
    ("trtllm-gen", "b200", {"kv_dtype": "float8_e4m3fn"}, {"kv_dtype", "q_dtype"},
     "BF16-Q + FP8-KV context is not shipped"),
    ("trtllm-gen", "b200", {"pos_encoding": "ALIBI"}, {"pos_encoding"}, "no ALiBi"),
    ("xqa", "a100", {"phase": "decode"}, {"sm"}, "majors 9/10/12 only"),
    ("xqa", "h100", {}, {"phase"}, "decode kernel"),
    ("xqa", "h100", {"phase": "decode", "return_lse": True}, {"return_lse"}, "no LSE"),
    ("xqa", "h100", {"phase": "decode", "page_size": 8}, {"page_size"}, "pages 16/32/64/128"),
    ("xqa", "h100", {"phase": "decode", "q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}, {"q_dtype"},
     "Q fp16/bf16 only"),
    ("xqa", "h100", {"phase": "decode", "head_dim_qk": 120, "head_dim_vo": 120}, {"head_dim_qk"},
     "multiple of 16"),
    ("xqa", "h100", {"phase": "decode", "kv_storage": "ragged", "page_size": 0}, {"kv_storage"}, "paged only"),
    ("fa3", "b200", {}, {"sm"}, "sm90 kernels only"),
    ("fa3", "a100", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}, {"sm", "q_dtype", "device_fp8"},
     "fp8 only on Hopper"),
    ("fa3", "h100", {"pos_encoding": "ALIBI"}, {"pos_encoding"}, "no ALiBi"),
    ("fa3", "h100", {"has_sinks": True}, {"has_sinks"}, "no sinks upstream"),
    ("fa3", "h100", {"mask": "custom"}, {"mask"}, "no custom mask"),
    ("fa3", "h100", {"q_dtype": "float8_e5m2", "kv_dtype": "float8_e5m2"}, {"q_dtype", "kv_dtype"}, "e4m3 only"),
    ("fa2", "h100", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}, {"q_dtype"}, "no fp8 Q"),
    ("fa2", "h100", {"has_sinks": True}, {"has_sinks"}, "no sinks"),
    ("fa2", "h100", {"head_dim_qk": 1024, "head_dim_vo": 1024}, {"head_dim_qk"},
     "<= 256 (flash_attn); 512 only with flashinfer >= 0.6.14, a provider limit (tests/test_known_defects.py)"),
    ("torch-flash", "h100", {}, {"kv_storage"}, "no paged KV in the adapter"),
    ("torch-flash", "h100", {"kv_storage": "ragged", "page_size": 0, "logits_soft_cap": 30.0},
     {"has_soft_cap", "logits_soft_cap"}, "no soft cap in the schema"),
    ("torch-flash", "h100", {"kv_storage": "ragged", "page_size": 0, "q_dtype": "float8_e4m3fn",
                             "kv_dtype": "float8_e4m3fn"}, {"q_dtype"}, "fp16/bf16 only"),
    ("cudnn", "h100", {"logits_soft_cap": 30.0}, {"has_soft_cap", "logits_soft_cap"}, "no soft cap via FI"),
    ("cudnn", "h100", {"pos_encoding": "ALIBI"}, {"pos_encoding"}, "no ALiBi with bottom-right"),
    ("cudnn", "h100", {"mask": "custom"}, {"mask"}, "no custom mask"),
    ("cudnn", "h100", {"head_dim_qk": 100, "head_dim_vo": 100}, {"head_dim_qk"}, "multiple of 8"),
    ("cudnn", "a100", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}, {"q_dtype", "kv_dtype", "sm"},
     "fp8 needs Hopper+"),
    # dtype rules relative to Q's dtype: data since the "front door" work (they were adapter code)
    ("xqa", "h100", {"phase": "decode", "out_dtype": "float32"}, {"out_dtype"}, "output in Q's dtype"),
    ("xqa", "h100", {"phase": "decode", "kv_dtype": "float16"}, {"kv_dtype"}, "K/V = Q or fp8 e4m3"),
    ("trtllm-gen", "b200", {"kv_dtype": "float16"}, {"kv_dtype"}, "KV = Q for 16-bit Q"),
    ("fa3", "h100", {"kv_dtype": "float8_e4m3fn"}, {"kv_dtype"}, "K/V dtype equals Q's"),
    ("fa3", "h100", {"kv_dtype": "float16"}, {"kv_dtype"}, "K/V dtype equals Q's"),
    ("fa3", "h100", {"out_dtype": "float32"}, {"out_dtype"}, "output in Q's dtype"),
    ("fa3", "h100", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn", "out_dtype": "float8_e4m3fn"},
     {"out_dtype"}, "fp8 inputs give bf16 output"),
    ("fa2", "h100", {"out_dtype": "float32"}, {"out_dtype"}, "output same dtype"),
    ("fa2", "h100", {"out_dtype": "float16"}, {"out_dtype"}, "output same dtype"),
    ("torch-flash", "h100", {"kv_storage": "ragged", "page_size": 0, "kv_dtype": "float16"}, {"kv_dtype"},
     "q/k/v one dtype"),
    ("torch-flash", "h100", {"kv_storage": "ragged", "page_size": 0, "out_dtype": "float32"}, {"out_dtype"},
     "output like q"),
    ("cudnn", "h100", {"kv_dtype": "float16"}, {"kv_dtype"}, "K/V in Q's dtype (no sdpa_fp8 path)"),
    ("cudnn", "h100", {"out_dtype": "float32"}, {"out_dtype"}, "output in Q's dtype"),
]
MUST_REJECT_IDS = [f"{b}-{gpu}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'base'}"
                   for b, gpu, o, _, _ in MUST_REJECT]


@pytest.mark.parametrize("backend, gpu, overrides, fields, fact", MUST_REJECT, ids=MUST_REJECT_IDS)
def test_data_never_over_promises(backend, gpu, overrides, fields, fact):
    device = capability_db.resolve_device(gpu)
    reasons = get_backend(backend).check(base_problem(**overrides), device)  # data + extra_checks
    named = {r.field for r in reasons}
    assert named & fields, (f"{backend} on {gpu} accepts {overrides or 'the base problem'} "
                            f"(vendor fact: {fact}); reasons named {sorted(named) or 'nothing'}")
    assert all(r.source for r in reasons)


@pytest.mark.parametrize("name", ALL_CAPS)
def test_each_backend_accepts_a_problem_inside_its_documented_envelope(name):
    """The base problem (paged bf16 d128 page 16 causal) is within every vendor's documented
    envelope on some GPU; data that refuses it everywhere would make the backend unreachable."""
    gpus = {"cudnn": "h100", "trtllm-gen": "b200", "xqa": "h100", "fa3": "h100", "fa2": "a100",
            "torch-flash": "h100", "native-triton": "h100", "reference": "cpu"}
    overrides = {"xqa": {"phase": "decode"}, "torch-flash": {"kv_storage": "ragged", "page_size": 0}}.get(name, {})
    device = capability_db.resolve_device(gpus[name])
    if name == "reference":
        overrides = {"device_type": "cpu", "window_left": 5, "logits_soft_cap": 10.0, "has_sinks": True,
                     "return_lse": True, "mask": "custom", "pos_encoding": "ALIBI"}
    reasons = get_backend(name).check(base_problem(**overrides), device)
    assert reasons == [], f"{name} refuses the base problem on {gpus[name]}: {[str(r) for r in reasons]}"


# -- dtype rules relative to Q: data, and exactly the rules the adapters applied in code -------------
# What each adapter's extra_checks refused before the rules moved into the capability files
# (q, kv, out dtype names -> refused). The data must refuse exactly these, on top of its value lists.
CODE_DTYPE_RULES = {
    "fa2": lambda q, kv, out: out != q,
    "fa3": lambda q, kv, out: out != ("bfloat16" if q == "float8_e4m3fn" else q) or kv != q,
    "cudnn": lambda q, kv, out: kv != q or out != q,
    "torch-flash": lambda q, kv, out: kv != q or out != q,
    "trtllm-gen": lambda q, kv, out: q != "float8_e4m3fn" and kv != q,
    "xqa": lambda q, kv, out: kv not in (q, "float8_e4m3fn") or out not in (q, "float8_e4m3fn")
    or (out == "float8_e4m3fn" and kv != "float8_e4m3fn"),  # fp8 output: FlashInfer 0.7's, with an fp8 cache
}
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2")
DTYPE_FACTS = ("q_dtype", "kv_dtype", "out_dtype")


@pytest.mark.parametrize("name", sorted(CODE_DTYPE_RULES))
def test_dtype_rules_moved_from_code_to_data_refuse_what_the_code_refused(name):
    caps = capability_db.backend_caps(name)
    device = capability_db.resolve_device("b200" if name == "trtllm-gen" else "h100")
    lists = [c for c in caps.constraints if c.fact in DTYPE_FACTS]  # the value lists the data always had
    for q, kv, out in itertools.product(DTYPES, repeat=3):
        problem = base_problem(q_dtype=q, kv_dtype=kv, out_dtype=out)
        facts = problem.facts()
        by_lists = any(c.applies(facts) and not c.accepts(facts[c.fact]) for c in lists)
        reasons = get_backend(name).check(problem, device)
        refused = bool({r.field for r in reasons} & set(DTYPE_FACTS))
        assert refused == (by_lists or CODE_DTYPE_RULES[name](q, kv, out)), (name, q, kv, out, [str(r) for r in reasons])
        assert not [r for r in get_backend(name).extra_checks(problem, device) if r.field in DTYPE_FACTS], (
            f"{name}: a dtype rule is still adapter code; it belongs in capability_db/backends/{name}.json")


def test_a_relative_dtype_rule_reads_as_the_dtype_and_what_it_must_equal():
    reasons = get_backend("xqa").check(base_problem(phase="decode", out_dtype="float16"), capability_db.resolve_device("h100"))
    (reason,) = [r for r in reasons if r.field == "out_dtype"]
    assert reason.value == "float16"
    assert reason.allowed == "equal to q_dtype 'bfloat16' (when out_dtype in ['float16', 'bfloat16'])"
    assert reason.source.startswith("flashinfer-python 0.7.2 flashinfer/xqa.py")
    reasons = get_backend("trtllm-gen").check(base_problem(kv_dtype="float16"), capability_db.resolve_device("b200"))
    assert [(r.value, r.allowed) for r in reasons if r.field == "kv_dtype"] == [
        ("float16", "equal to q_dtype 'bfloat16' (when q_dtype in ['float16', 'bfloat16'])")]


@pytest.mark.parametrize("backend, gpu, overrides", [
    ("xqa", "h100", {"phase": "decode", "kv_dtype": "float8_e4m3fn"}),  # fp8 KV with 16-bit Q
    ("fa3", "h100", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn", "head_dim_qk": 128}),  # out stays bf16
    ("trtllm-gen", "b200", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}),
    ("fa2", "h100", {"kv_dtype": "float8_e4m3fn"}),  # through the FlashInfer fa2 provider
])
def test_relative_dtype_rules_keep_what_the_vendors_serve(backend, gpu, overrides):
    reasons = get_backend(backend).check(base_problem(**overrides), capability_db.resolve_device(gpu))
    assert reasons == [], [str(r) for r in reasons]


def test_flash_attn_alone_refuses_fp8_kv_a_provider_limit():
    """fa2's two providers differ: FlashInfer's dequantizes fp8 K/V, Dao-AILab flash_attn has no fp8."""
    from backends._fi_prefill import FlashInferPrefill
    from backends._flash_attn import DaoFA2

    problem = base_problem(kv_dtype="float8_e4m3fn", page_size=256)
    assert [r.field for r in DaoFA2().limits(problem)] == ["kv_dtype"]
    assert FlashInferPrefill("fa2").limits(problem) == []


@pytest.mark.parametrize("allowed", [[False], [True, False]])
def test_a_relative_dtype_rule_only_says_equal(allowed):
    with pytest.raises(ValueError, match="allowed must be \\[true\\]"):
        Constraint(fact="kv_dtype_is_q_dtype", allowed=allowed, source="t")


def test_backend_reason_sources_cite_public_material():
    """The sources written in the adapters' code (their SRC constants and the literal sources of
    the Reasons they raise) name vendor files and versions, not files only this repository has."""
    import ast
    from pathlib import Path
    root = Path(capability_db.__file__).resolve().parents[1] / "backends"
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            texts = []
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("SRC")
                                                    for t in node.targets):
                texts = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "Reason", "rejected"):
                texts = [c.value for c in node.args[-1:] if isinstance(c, ast.Constant)]
            bad += [f"{path.name}: {t}" for t in texts if isinstance(t, str) and any(w in t for w in NOT_PUBLIC)]
    assert not bad, bad
