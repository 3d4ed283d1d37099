"""The attn-dispatch command line: query (sm_80/90/100/120 and CPU), info, matrix, README sync.

Query expectations come from the vendors' public facts (the vendor cited per test: its documentation
or source), not from the capability files: a failure here means the data and the vendor facts
disagree.
"""
from __future__ import annotations

import json
import re
import sys

import pytest
import torch

import capability_db
from backends import REGISTRY
from capability_db import render
from capability_db.schema import BackendCaps
from dispatch import cli

VENDOR_MODULES = ("cudnn", "flashinfer", "flash_attn", "flash_attn_interface", "tensorrt_llm")
BASE = ["--heads", "32/8", "--head-dim", "128", "--dtype", "bf16"]


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def query(capsys, gpu, *options):
    rc, out, _ = run_cli(capsys, "query", "--gpu", gpu, *BASE, *options, "--json")
    data = json.loads(out)
    assert rc == (0 if data["chosen"] else 1)
    return data


def candidate(data, backend):
    found = [c for c in data["candidates"] if c["backend"] == backend]
    assert found, f"{backend} is not a candidate: {[c['backend'] for c in data['candidates']]}"
    return found[0]


def rejected_fields(data, backend):
    c = candidate(data, backend)
    assert not c["accepted"], f"{backend} accepted a problem the vendor facts exclude"
    return {r["field"] for r in c["reasons"]}


def accepted(data, backend):
    c = candidate(data, backend)
    assert c["accepted"], f"{backend} rejected: {[r['text'] for r in c['reasons']]}"
    return True


PAGED_PREFILL = ["--phase", "prefill", "--kv", "paged", "--page-size", "16", "--causal"]
PAGED_DECODE = ["--phase", "decode", "--kv", "paged", "--page-size", "16"]


# -- sm_90 (Hopper) ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["h100", "sm_90", "sm90", "9.0", "h200"])
def test_query_sm90_paged_prefill_ranks_by_the_calls_sizes(capsys, gpu):
    # Long prompts: fa3 (FA3: sm_90, bf16, d128, causal); a few query tokens per request
    # (chunked decode): fa2, measured 3.4x faster than fa3 on the H100's grid; every sm_90 GPU ranks
    # by a compiled choice table (capability_db/tables/<gpu>.json): its own, else its SM's scaled to it.
    data = query(capsys, gpu, *PAGED_PREFILL, "--sizes", "8", "2048", "2048")
    assert data["device"]["arch"] == "sm_90" and data["device"]["family"] == "hopper"
    assert data["chosen"] == "fa3"
    assert data["problem"]["page_size"] == 16 and data["problem"]["causal"] is True
    chunked = query(capsys, gpu, *PAGED_PREFILL, "--sizes", "64", "16", "2048")["chosen"]
    assert chunked == "fa2"


def test_query_sm90_trtllm_entry_rejects_trtllm_gen_by_sm(capsys):
    data = query(capsys, "h100", *PAGED_PREFILL, "--entry", "trtllm_batch_context_with_kv_cache")
    assert data["candidates"][0]["backend"] == "trtllm-gen"  # the entry's own engine goes first
    assert "sm" in rejected_fields(data, "trtllm-gen")  # trtllm-gen: SM100/103/107 only
    sm_reason = [r for r in candidate(data, "trtllm-gen")["reasons"] if r["field"] == "sm"][0]
    assert sm_reason["value"] == 90 and sm_reason["source"]
    assert sm_reason["text"].startswith("sm=90: allowed one of 100, 103, 107")  # one vocabulary: SM numbers
    # device-side lengths: cuDNN and native-triton (no host re-plan per call) before FlashInfer's
    # fa2/fa3, see priorities.json; the H200's fitted table (scaled) ranks those two
    assert data["chosen"] in ("cudnn", "native-triton")


def test_query_sm90_decode_xqa_accepted_torch_flash_rejects_paged(capsys):
    data = query(capsys, "h100", *PAGED_DECODE)
    assert accepted(data, "xqa")  # XQA: major 9, paged, page 16, bf16, d128
    assert "kv_storage" in rejected_fields(data, "torch-flash")  # torch-flash: no paging in the adapter
    assert data["chosen"] is not None and data["chosen"] != "torch-flash"


def test_query_sm90_decode_with_lse_rejects_xqa(capsys):
    data = query(capsys, "h100", *PAGED_DECODE, "--lse")
    assert "return_lse" in rejected_fields(data, "xqa")  # XQA has no LSE
    assert data["chosen"] != "xqa"


def test_query_sm90_prefill_rejects_xqa_by_phase(capsys):
    data = query(capsys, "h100", *PAGED_PREFILL, "--entry", "xqa_batch_decode_with_kv_cache")
    assert "phase" in rejected_fields(data, "xqa")  # XQA: a decode kernel


def test_query_sm90_fp8_prefill_fa3_with_bf16_out(capsys):
    data = query(capsys, "h100", *PAGED_PREFILL[:-1], "--dtype", "fp8")
    assert data["problem"]["q_dtype"] == "float8_e4m3fn" and data["problem"]["out_dtype"] == "bfloat16"
    assert data["chosen"] == "fa3"  # FA3: e4m3 Q+KV, bf16 out on Hopper
    assert "q_dtype" in rejected_fields(data, "fa2")  # FA2: no fp8 Q


# -- sm_80 (Ampere) ----------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["a100", "sm_80"])
def test_query_sm80_ragged_prefill_chooses_fa2(capsys, gpu):
    data = query(capsys, gpu, "--phase", "prefill", "--kv", "ragged", "--causal")
    assert data["device"]["arch"] == "sm_80"
    assert data["chosen"] == "fa2"  # FA2: SM80+, bf16, d128, varlen; first in the Ampere list
    for name in ("fa3", "xqa", "trtllm-gen"):  # not Ampere engines: listed after the ranked ones, rejected
        c = candidate(data, name)
        assert not c["ranked"] and not c["accepted"] and c["why_here"] == "not in the ampere/prefill priority list"


def test_query_sm80_fp8_is_refused_by_fa2_and_cudnn(capsys):
    data = query(capsys, "a100", *PAGED_PREFILL, "--dtype", "fp8")
    assert "q_dtype" in rejected_fields(data, "fa2")  # FA2: fp16/bf16 only
    assert rejected_fields(data, "cudnn") & {"q_dtype", "sm"}  # cuDNN: fp8 needs Hopper+
    assert data["chosen"] not in ("fa2", "cudnn")


def test_query_sm80_trtllm_entry_rejects_trtllm_gen_by_sm(capsys):
    data = query(capsys, "a100", *PAGED_PREFILL, "--entry", "trtllm_batch_context_with_kv_cache")
    assert "sm" in rejected_fields(data, "trtllm-gen")


def test_query_sm80_head_dim_256_rejected_by_cudnn(capsys):
    data = query(capsys, "a100", *PAGED_PREFILL, "--head-dim", "256")
    assert "head_dim_qk" in rejected_fields(data, "cudnn")  # cuDNN: <= 128 on Ampere (cuDNN <= 9.9)
    assert "kv_storage" in rejected_fields(data, "torch-flash")


# -- sm_100 (Blackwell) ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["b200", "sm_100"])
def test_query_sm100_paged_prefill_chooses_trtllm_gen(capsys, gpu):
    data = query(capsys, gpu, *PAGED_PREFILL)
    assert data["device"]["arch"] == "sm_100"
    assert data["chosen"] == "trtllm-gen"  # trtllm-gen: SM100, bf16, d128, page 16 (power of 2), causal


def test_query_sm100_soft_cap_rejected_by_trtllm_gen_and_cudnn(capsys):
    data = query(capsys, "b200", *PAGED_PREFILL, "--soft-cap", "30")
    assert rejected_fields(data, "trtllm-gen") & {"has_soft_cap", "logits_soft_cap"}
    assert rejected_fields(data, "cudnn") & {"has_soft_cap", "logits_soft_cap"}  # cuDNN: not via FI
    assert data["chosen"] not in ("trtllm-gen", "cudnn")


def test_query_sm100_non_causal_window_rejected_by_trtllm_gen(capsys):
    data = query(capsys, "b200", "--phase", "prefill", "--kv", "paged", "--page-size", "16", "--window", "128")
    assert rejected_fields(data, "trtllm-gen") & {"has_window", "window_left", "causal"}


def test_query_sm100_causal_window_accepted_by_trtllm_gen(capsys):
    data = query(capsys, "b200", *PAGED_PREFILL, "--window", "128")
    assert data["chosen"] == "trtllm-gen"


def test_query_sm100_split_head_dims_rejected_by_trtllm_gen(capsys):
    data = query(capsys, "b200", *PAGED_PREFILL, "--head-dim", "192/128")
    assert rejected_fields(data, "trtllm-gen") & {"same_head_dims", "head_dim_vo", "head_dim_qk"}


def test_query_sm100_bf16_q_with_fp8_kv_rejected_by_trtllm_gen(capsys):
    data = query(capsys, "b200", *PAGED_PREFILL, "--kv-dtype", "fp8")
    # trtllm-gen: "BF16-Q + FP8-KV context is not shipped" ("Missing TRTLLM-GEN kernel")
    assert rejected_fields(data, "trtllm-gen") & {"kv_dtype", "q_dtype"}


def test_query_sm100_paged_decode_chooses_xqa(capsys):
    data = query(capsys, "b200", *PAGED_DECODE)
    assert data["chosen"] == "xqa"  # XQA: major 10; first in the Blackwell decode list


# -- sm_120 (consumer Blackwell) -----------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["rtx5090", "sm_120"])
def test_query_sm120_paged_decode_chooses_xqa(capsys, gpu):
    data = query(capsys, gpu, *PAGED_DECODE)
    assert data["device"]["arch"] == "sm_120"
    assert data["chosen"] == "xqa"  # XQA: major 12


def test_query_sm120_trtllm_entry_rejects_trtllm_gen_by_sm(capsys):
    data = query(capsys, "rtx5090", *PAGED_PREFILL, "--entry", "trtllm_batch_context_with_kv_cache")
    assert "sm" in rejected_fields(data, "trtllm-gen")  # trtllm-gen: not SM120/121


def test_query_sm120_xqa_page_size_8_rejected(capsys):
    data = query(capsys, "sm_120", "--phase", "decode", "--kv", "paged", "--page-size", "8")
    assert "page_size" in rejected_fields(data, "xqa")  # XQA: {16, 32, 64, 128}


def test_query_sm120_prefill_with_sinks_rejects_fa2(capsys):
    data = query(capsys, "rtx5090", *PAGED_PREFILL, "--sinks")
    assert "has_sinks" in rejected_fields(data, "fa2")  # FA2: no sinks
    assert data["chosen"] != "fa2"


# -- CPU ----------------------------------------------------------------------------------------
def test_query_cpu_chooses_reference(capsys):
    data = query(capsys, "cpu", *PAGED_PREFILL, "--window", "7", "--soft-cap", "20", "--sinks", "--lse")
    assert data["device"]["kind"] == "cpu" and data["problem"]["device_type"] == "cpu"
    assert data["chosen"] == "reference"
    assert data["problem"]["window_left"] == 7 and data["problem"]["logits_soft_cap"] == 20.0


# -- every backend, ranked or not -------------------------------------------------------------
@pytest.mark.parametrize("gpu, options", [("h100", PAGED_PREFILL), ("h100", PAGED_DECODE), ("a100", PAGED_PREFILL),
                                          ("b200", PAGED_DECODE), ("cpu", PAGED_PREFILL)])
def test_query_lists_every_backend_ranked_first(capsys, gpu, options):
    data = query(capsys, gpu, *options)
    names = [c["backend"] for c in data["candidates"]]
    assert sorted(names) == sorted(capability_db.BACKEND_NAMES) and len(set(names)) == len(names)
    ranked = [c["ranked"] for c in data["candidates"]]
    assert ranked == sorted(ranked, reverse=True), "an unranked backend sits before a ranked one"
    device = capability_db.resolve_device(gpu)
    listed = [e.backend for e in capability_db.candidates(device, data["problem"]["phase"], data["problem"]["entry"])]
    # the accepted candidates trade places by measured time among their own slots; a rejected one keeps its place
    assert sorted(names[:len(listed)]) == sorted(listed) and all(ranked[:len(listed)]) and not any(ranked[len(listed):])
    for i, c in enumerate(data["candidates"][:len(listed)]):
        assert c["accepted"] or c["backend"] == listed[i], f"rejected {c['backend']} left its priority slot"
    where = capability_db.priority_list_name(device, data["problem"]["phase"])
    assert all(c["why_here"] == f"not in the {where} priority list" for c in data["candidates"] if not c["ranked"])


def test_query_sm90_prefill_shows_xqa_outside_the_list_rejected_by_phase(capsys):
    data = query(capsys, "h100", *PAGED_PREFILL)
    xqa = candidate(data, "xqa")
    assert not xqa["ranked"] and xqa["why_here"] == "not in the hopper/prefill priority list"
    assert "phase" in {r["field"] for r in xqa["reasons"]}
    rc, out, _ = run_cli(capsys, "query", "--gpu", "h100", *BASE, *PAGED_PREFILL)
    assert "   - rejected xqa            phase='prefill': allowed one of 'decode', 'spec_decode'" in out
    rc, out, _ = run_cli(capsys, "query", "--gpu", "h100", *BASE, *PAGED_PREFILL, "--verbose")
    assert "   - rejected xqa            not in the hopper/prefill priority list" in out


def test_an_unranked_backend_that_accepts_is_not_chosen_but_can_be_forced(capsys):
    """On the CPU only reference is ranked; native-triton (unranked there) accepts a CPU problem under
    the Triton interpreter only when forced, and query never picks it."""
    data = query(capsys, "cpu", *PAGED_PREFILL)
    assert data["chosen"] == "reference"
    assert all(c["backend"] == "reference" or not c["ranked"] for c in data["candidates"])


# -- query: laptop-safe, clear errors, human output ----------------------------------------------
def test_query_never_touches_a_gpu_nor_imports_vendor_packages(capsys, monkeypatch):
    def no_gpu(*args, **kwargs):
        raise AssertionError("query touched the CUDA runtime")

    for name in ("is_available", "get_device_capability", "get_device_name", "current_device", "init"):
        monkeypatch.setattr(torch.cuda, name, no_gpu)
    before = {m for m in VENDOR_MODULES if m in sys.modules}
    for gpu, options in (("h100", PAGED_PREFILL), ("b200", PAGED_DECODE), ("rtx5090", PAGED_DECODE)):
        query(capsys, gpu, *options)
    assert {m for m in VENDOR_MODULES if m in sys.modules} == before


def test_query_human_output_lists_every_candidate_in_order(capsys):
    rc, out, _ = run_cli(capsys, "query", "--gpu", "h100", *BASE, *PAGED_DECODE, "--lse")
    data = query(capsys, "h100", *PAGED_DECODE, "--lse")
    assert rc == 0
    lines = [line for line in out.splitlines() if re.match(r"  \d+\. |   - ", line)]
    assert [line.split()[2] for line in lines] == [c["backend"] for c in data["candidates"]]
    assert f"chosen: {data['chosen']}" in out
    assert "return_lse=True: allowed" in out  # xqa's reason, with value and what is allowed
    assert "device:  h100 (sm_90, hopper, fp8)" in out


@pytest.mark.parametrize("argv, option, shown", [
    (["--gpu", "sm_999"], "--gpu", ["'sm_999'", "h100", "sm_120", "cpu"]),
    (["--gpu", "h100", "--dtype", "int8"], "--dtype", ["'int8'", "bf16", "fp8"]),
    (["--gpu", "h100", "--heads", "32/5"], "--heads", ["32/5", "multiple of kv heads"]),
    (["--gpu", "h100", "--heads", "x"], "--heads", ["'x'", "32/8"]),
    (["--gpu", "h100", "--head-dim", "0"], "--head-dim", ["'0'", "positive"]),
    (["--gpu", "h100", "--phase", "verify"], "--phase", ["'verify'", "prefill", "spec_decode"]),
    (["--gpu", "h100", "--kv", "flat"], "--kv", ["'flat'", "paged", "ragged", "dense"]),
    (["--gpu", "h100", "--window", "-3"], "--window", ["'-3'", ">= 0"]),
    (["--gpu", "h100", "--soft-cap", "0"], "--soft-cap", ["'0'", "> 0"]),
    (["--gpu", "h100", "--page-size", "0"], "--page-size", ["'0'", "positive"]),
    (["--gpu", "h100", "--entry", "flash_attn"], "--entry", ["'flash_attn'", "xqa_batch_decode_with_kv_cache"]),
    (["--gpu", "h100", "--alibi", "--rope"], "--rope", ["not allowed with argument --alibi"]),
    (["--phase", "decode"], "--gpu", ["required"]),
])
def test_query_bad_arguments_exit_2_naming_option_value_and_allowed(capsys, argv, option, shown):
    with pytest.raises(SystemExit) as info:
        cli.main(["query", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert option in err, err
    for text in shown:
        assert text in err, err


def test_explain_on_this_machine_prints_the_decision(capsys):
    rc, out, _ = run_cli(capsys, "explain", *BASE, *PAGED_PREFILL)
    device = cli._this_device()
    assert rc == 0
    where = device.name if device.kind == "cpu" else f"{device.name} ({device.arch})"
    summary = " ".join(out.split("\nproblem: ")[0].split())  # the decision's one line, wrapped to 100 columns
    assert summary.endswith("accepts it)") and f"on {where}" in summary and "CHOSEN" in out
    if device.kind == "cpu":
        assert "CHOSEN   reference" in out


def test_explain_with_refused_backend_names_its_reasons(capsys):
    rc, out, _ = run_cli(capsys, "explain", "--gpu", "cpu", *BASE, *PAGED_PREFILL, "--backend", "xqa")
    assert rc == 1
    assert "'xqa' (chosen by backend= argument) cannot serve" in out
    assert "device_kind='cpu'" in out and "backends that would accept it: reference" in out


@pytest.mark.parametrize("options, entry", [
    ([], "BatchPrefillWithPagedKVCacheWrapper"), (["--kv", "ragged"], "BatchPrefillWithRaggedKVCacheWrapper"),
    (["--kv", "dense"], "single_prefill_with_kv_cache"),
    (["--entry", "trtllm_batch_context_with_kv_cache"], "trtllm_batch_context_with_kv_cache")])
def test_explain_names_the_entry_point_it_explains(capsys, options, entry):
    """Without --entry, the FlashInfer call that takes the KV storage given; never a made-up name."""
    rc, out, _ = run_cli(capsys, "explain", "--gpu", "cpu", *options)
    assert rc == 0 and " ".join(out.split()).startswith(f"reference serves {entry} on cpu"), out
    data = query(capsys, "cpu", *options)
    assert data["problem"]["entry"] == entry


def test_query_and_info_state_the_sm_in_one_vocabulary(capsys):
    rc, out, _ = run_cli(capsys, "query", "--gpu", "h100", *BASE, *PAGED_PREFILL,
                         "--entry", "trtllm_batch_context_with_kv_cache")
    assert "sm=90: allowed one of 100, 103, 107" in out and "sm='sm_90'" not in out
    reasons = cli.device_reasons("trtllm-gen", capability_db.resolve_device("h100"))
    assert [str(r).split(" [")[0] for r in reasons] == ["sm=90: allowed one of 100, 103, 107"]


def test_explain_unknown_backend_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", "--gpu", "cpu", "--backend", "nope"])
    assert info.value.code == 2
    assert "--backend" in capsys.readouterr().err


# -- info --------------------------------------------------------------------------------------
def test_info_json_lists_every_backend_with_reasons(capsys):
    rc, out, _ = run_cli(capsys, "info", "--json")
    data = json.loads(out)
    assert rc == 0
    assert data["torch"] == torch.__version__ and data["cuda_available"] == torch.cuda.is_available()
    assert [b["backend"] for b in data["backends"]] == list(REGISTRY)
    for b in data["backends"]:
        assert b["usable_here"] == (not b["why_not"]), b
        assert all(r["field"] and r["allowed"] for r in b["why_not"]), b
        assert b["hardware"]["status"] == capability_db.backend_caps(b["backend"]).hardware.status
    if not torch.cuda.is_available():
        usable = {b["backend"] for b in data["backends"] if b["usable_here"]}
        assert "reference" in usable
        assert not usable & {"cudnn", "trtllm-gen", "xqa", "fa3", "fa2", "torch-flash"}  # CUDA-only engines


def test_info_human_output_names_every_backend(capsys):
    rc, out, _ = run_cli(capsys, "info")
    assert rc == 0 and f"\ntorch {torch.__version__}; CUDA available: " in out
    for name in REGISTRY:
        assert f"  {name} " in out
    assert "timing table: " in out


def test_info_on_the_cpu_starts_with_what_runs_here(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, _ = run_cli(capsys, "info")
    rc_json, data, _ = run_cli(capsys, "info", "--json")
    summary = json.loads(data)["summary"]
    assert rc == rc_json == 0 and out.startswith(summary.split(";")[0])
    assert summary.startswith("CPU only: the PyTorch reference serves every entry point")
    assert summary.endswith("; GPU backends need CUDA") and " ".join(out.split()).startswith(summary)


def test_info_lists_every_known_defect_with_the_version_installed_here(capsys, monkeypatch):
    """The README says info lists the known defects: on any machine, as data, each with the
    provider's installed version and whether it is affected, or "not installed"."""
    known = capability_db.known_defects()
    assert known
    rc, out, _ = run_cli(capsys, "info", "--json")
    rows = json.loads(out)["known_defects"]
    assert [d["id"] for d in rows] == [d.id for d in known]
    rc, text, _ = run_cli(capsys, "info")
    flat = " ".join(text.split())
    assert "known defects of vendor versions (capability_db/defects.json):" in text
    for d in rows:
        here = f"{d['provider']} not installed" if d["installed"] is None else f"{d['provider']} {d['installed']} installed"
        assert d["id"] in flat and here in flat, d["id"]
    # a version at a defect's fix is not affected; any version of one that was never fixed is
    for d in known:
        version = d.versions.fixed or "999.0"
        monkeypatch.setattr(cli, "installed_version", lambda module, version=version: version)
        row = next(r for r in cli.known_defects_info() if r["id"] == d.id)
        assert row["installed"] == version and row["affected"] == (d.versions.fixed is None), d.id
        rc, text, _ = run_cli(capsys, "info")
        said = "affected" if row["affected"] else "not affected"
        assert f"{d.provider} {version} installed: {said}" in " ".join(text.split())


def test_installed_versions_come_from_package_metadata():
    assert cli.installed_version("torch") == torch.__version__
    assert cli.installed_version("no_such_module_anywhere") is None


def test_info_says_truly_how_to_get_triton(capsys, monkeypatch):
    """torch's CPU builds bring no triton: the line names the extra, and which torch builds bring it."""
    from backends.base import import_reason
    from backends.native.triton_backend import NativeTritonBackend

    missing = import_reason("triton", ModuleNotFoundError("No module named 'triton'"))
    monkeypatch.setattr(NativeTritonBackend, "_available", (missing,))
    rc, out, _ = run_cli(capsys, "info", "--json")
    row = next(b for b in json.loads(out)["backends"] if b["backend"] == "native-triton")
    assert not row["installed"] and "pip install 'attn-dispatch[triton]'" in row["install"]
    assert "CUDA builds of torch" in row["install"] and "CPU builds do not" in row["install"]
    rc, text, _ = run_cli(capsys, "info")
    assert f"get it: {row['install']}" in " ".join(text.split())


@pytest.mark.parametrize("gpu, says", [
    ("h200", "tables/h200.json ({h200} keys); this GPU's own"),
    ("h100", "tables/h100.json ({h100} keys); this GPU's own"),
    ("a100", "none for sm_80: the priority list decides"),
    ("cpu", "none: the priority list decides (no GPU)")])
def test_info_names_the_choice_table_the_choice_ranks_by(gpu, says):
    from capability_db import choice_table
    keys = {key: len(json.loads((choice_table.TABLES_DIR / f"{key}.json").read_text())["keys"])
            for key in ("h100", "h200")}
    assert choice_table.describe(capability_db.resolve_device(gpu)) == says.format(**keys)


def test_info_names_the_table_a_gpu_without_its_own_borrows_and_how_it_is_scaled():
    from capability_db import choice_table
    gh200 = capability_db.device_for_capability(9, 0, "NVIDIA GH200 480GB")
    borrowed = choice_table.table_for(gh200)
    ratio = 4.0 / borrowed.data["peak_tb_per_s"]
    assert choice_table.describe(gh200) == (
        f"tables/{borrowed.gpu}.json ({len(borrowed.data['keys'])} keys); {borrowed.gpu} table scaled to "
        f"NVIDIA GH200 480GB (bandwidth x{ratio:.2f}, compute x1.00)")
    unscaled = choice_table.describe(capability_db.resolve_device("sm_90"))
    assert unscaled.endswith("; " + borrowed.gpu + " table unscaled: no peak figures for sm_90")


def test_info_says_how_to_get_every_backend_that_is_not_installed(capsys):
    rc, out, _ = run_cli(capsys, "info", "--json")
    rows = json.loads(out)["backends"]
    rc, text, _ = run_cli(capsys, "info")
    flat = " ".join(text.split())  # the human form wraps long lines
    for b in rows:
        assert b["install"] == capability_db.backend_caps(b["backend"]).install
        if not b["installed"]:
            assert f"get it: {b['install']}" in flat, b["backend"]
    if not torch.cuda.is_available():  # torch is installed: no CUDA device is not "not installed"
        assert next(b for b in rows if b["backend"] == "torch-flash")["installed"]


# -- matrix ------------------------------------------------------------------------------------
def test_matrix_markdown_renders_every_backend(capsys):
    rc, out, _ = run_cli(capsys, "matrix", "--markdown")
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("| Backend | Archs |") and set(lines[1]) <= {"|", "-"}
    assert [line.split("|")[1].strip() for line in lines[2:]] == list(capability_db.BACKEND_NAMES)
    width = len(render.COLUMNS) + 2
    assert all(len(line.replace("\\|", "")) and line.replace("\\|", "").count("|") == width - 1 for line in lines)


def test_matrix_for_a_terminal_fits_100_columns_and_names_every_backend(capsys):
    rc, out, _ = run_cli(capsys, "matrix")
    assert rc == 0
    lines = out.rstrip("\n").splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert [line for line in lines if line and not line.startswith(" ")] == list(capability_db.BACKEND_NAMES)
    block = out.split("\n\nxqa\n")[1].split("\n\n")[0]
    assert "Not supported: Soft cap, ALiBi, RoPE, Custom mask, LSE" in block  # xqa.json: return_lse [false]


@pytest.mark.parametrize("argv", [
    ["query", "--gpu", "h100", *BASE, *PAGED_PREFILL], ["query", "--gpu", "a100", *BASE, *PAGED_DECODE, "--lse"],
    ["explain", "--gpu", "cpu", *BASE, *PAGED_PREFILL], ["info"], ["matrix"],
])
def test_human_output_fits_100_columns(capsys, argv):
    rc, out, _ = run_cli(capsys, *argv)
    too_long = [line for line in out.splitlines() if len(line) > 100]
    assert not too_long, too_long[0]


def _runs_on_the_cpu(capsys, backend: str) -> bool:
    """What query answers on the CPU (capability data and the adapter's extra checks): no device reason."""
    from dispatch import router

    router.clear_caches()  # decisions are cached per problem; TRITON_INTERPRET changed
    return "device_kind" not in {r["field"] for r in candidate(query(capsys, "cpu"), backend)["reasons"]}


@pytest.mark.parametrize("backend", capability_db.BACKEND_NAMES)
def test_the_matrix_lists_the_cpu_for_a_backend_exactly_where_query_and_explain_accept_it(capsys, monkeypatch,
                                                                                        backend):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a user's CPU: Triton's interpreter off
    archs = render.matrix_row(capability_db.backend_caps(backend))["archs"]
    kinds = archs.split(";")[0].split(", ")
    assert (archs.startswith("any") or "CPU" in kinds) == _runs_on_the_cpu(capsys, backend), archs
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if _runs_on_the_cpu(capsys, backend) and "CPU" not in kinds and not archs.startswith("any"):
        assert "CPU only under TRITON_INTERPRET=1" in archs  # the condition, as explain states it


def test_matrix_json_rows_follow_the_data(capsys):
    rc, out, _ = run_cli(capsys, "matrix", "--json")
    data = json.loads(out)
    assert rc == 0
    assert [c["key"] for c in data["columns"]] == [k for k, _ in render.COLUMNS]
    rows = {r["backend"]: r for r in data["rows"]}
    assert list(rows) == list(capability_db.BACKEND_NAMES)
    for name, row in rows.items():
        caps = capability_db.backend_caps(name)
        assert row["title"] == caps.title and row["hardware"].startswith(caps.hardware.status)
    assert rows["reference"]["archs"] == "any (CPU too)"
    assert rows["xqa"]["lse"] == "no"  # xqa.json: return_lse allowed [false]


# Before the dtype rules moved from adapter code into the data, every Out cell here read "any".
DTYPE_CELLS = {  # backend -> (KV dtype cell, Out dtype cell)
    "cudnn": ("fp16, bf16; = q_dtype", "= q_dtype"),
    "trtllm-gen": ("fp16, bf16, e4m3; = q_dtype (if q_dtype=fp16/bf16)", "fp16, bf16"),
    "xqa": ("fp16, bf16, e4m3; = q_dtype (if kv_dtype=fp16/bf16); e4m3 (if out_dtype=e4m3)",
            "fp16, bf16, e4m3; = q_dtype (if out_dtype=fp16/bf16)"),
    "fa3": ("fp16, bf16, e4m3; = q_dtype", "bf16 (if q_dtype=e4m3); = q_dtype (if q_dtype=fp16/bf16)"),
    "fa2": ("fp16, bf16, e4m3, e5m2, uint8", "= q_dtype"),  # flash_attn's K/V = Q, NVFP4 FlashInfer's: provider limits
    "torch-flash": ("fp16, bf16; = q_dtype", "= q_dtype"),
}


@pytest.mark.parametrize("backend", sorted(DTYPE_CELLS))
def test_matrix_dtype_cells_show_the_rules_the_adapters_apply(backend):
    row = render.matrix_row(capability_db.backend_caps(backend))
    assert (row["kv_dtype"], row["out_dtype"]) == DTYPE_CELLS[backend]
    assert "any" not in (row["q_dtype"], row["kv_dtype"], row["out_dtype"])
    assert "dtype_is_q_dtype" not in row["other"]  # shown in the dtype columns, not as "other limits"


SYNTHETIC = {
    "name": "synthetic", "title": "a made-up backend", "adapter": "backends.synthetic:SyntheticBackend",
    "install": "never: it is made up", "cuda_graph": "after_warmup",
    "cuda_graph_source": "test", "hardware": {"status": "partial", "where": "H100 (sm_90)"},
    "constraints": [
        {"fact": "device_kind", "allowed": ["cuda"], "source": "t"},
        {"fact": "sm", "min": 90, "source": "t"},
        {"fact": "q_dtype", "allowed": ["bfloat16", "float8_e4m3fn"], "source": "t"},
        {"fact": "head_dim_qk", "max": 256, "multiple_of": 8, "source": "t"},
        {"fact": "head_dim_vo", "max": 256, "multiple_of": 8, "source": "t"},
        {"fact": "page_size", "power_of_two": True, "when": {"kv_storage": ["paged"]}, "source": "t"},
        {"fact": "has_window", "allowed": [False], "when": {"causal": [False]}, "source": "t"},
        {"fact": "has_soft_cap", "allowed": [False], "source": "t"},
        {"fact": "pos_encoding", "allowed": ["NONE", "ALIBI"], "source": "t"},
        {"fact": "return_lse", "allowed": [False], "when": {"phase": ["decode"]}, "source": "t"},
        {"fact": "phase", "allowed": ["prefill", "decode"], "source": "t"},
        {"fact": "causal", "allowed": [True], "when": {"has_sinks": [True]}, "source": "t"},
        {"fact": "gqa_group", "max": 16, "source": "t"},
        {"fact": "cuda_graph", "allowed": [False], "source": "t"},
    ],
}


def test_matrix_cells_are_derived_from_constraints():
    row = render.matrix_row(BackendCaps.model_validate(SYNTHETIC))
    assert row["archs"] == "CUDA; sm_90+"
    assert row["q_dtype"] == "bf16, e4m3" and row["kv_dtype"] == "any"
    assert row["head_dims"] == "qk, vo: <= 256, multiple of 8"
    assert row["page_sizes"] == "power of 2"  # the kv_storage=paged condition is implied by the column
    assert row["phases"] == "prefill, decode" and row["spec_decode"] == "no"
    assert row["window"] == "yes (no if causal=no)"
    assert row["soft_cap"] == "no" and row["alibi"] == "yes" and row["rope"] == "no"
    assert row["lse"] == "yes (no if phase=decode)"
    assert row["sinks"] == "yes (needs causal yes)"
    assert row["causal"] == "yes" and row["custom_mask"] == "yes"
    assert row["other"] == "gqa_group: <= 16"
    assert row["cuda_graph"] == "never"  # a constraint refusing cuda_graph overrides the level
    assert row["hardware"] == "partial (H100 (sm_90))"


# -- README sync -----------------------------------------------------------------------------------
def test_readme_matrix_block_equals_the_rendered_matrix():
    block = render.readme_block(render.README_PATH.read_text())
    assert block.strip() == render.render_markdown().strip(), (
        "README matrix block is stale: run `attn-dispatch matrix --update-readme`")


def test_update_readme_rewrites_only_the_block(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n{render.README_BEGIN}\nold table\n{render.README_END}\nafter\n")
    rc, out, _ = run_cli(capsys, "matrix", "--update-readme", "--readme", str(readme))
    assert rc == 0 and "updated" in out
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{render.README_END}\nafter\n")
    assert render.readme_block(text).strip() == render.render_markdown()
    rc, out, _ = run_cli(capsys, "matrix", "--update-readme", "--readme", str(readme))
    assert rc == 0 and "already up to date" in out and readme.read_text() == text


def test_update_readme_without_markers_fails_naming_them(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no block here\n")
    rc, _, err = run_cli(capsys, "matrix", "--update-readme", "--readme", str(readme))
    assert rc == 1 and render.README_BEGIN in err and readme.read_text() == "# no block here\n"


# -- probe / bench hooks ------------------------------------------------------------------------------
def test_probe_and_bench_hand_over_every_argument_to_their_modules(monkeypatch):
    from dispatch.benchmark import bench, probe

    calls = []
    monkeypatch.setattr(probe, "main", lambda argv: calls.append(("probe", argv)) or 7)
    monkeypatch.setattr(bench, "main", lambda argv: calls.append(("bench", argv)) or 0)
    assert cli.main(["probe", "--backends", "cudnn", "--json"]) == 7
    assert cli.main(["bench", "--quick", "--out", "/tmp/x"]) == 0
    assert calls == [("probe", ["--backends", "cudnn", "--json"]), ("bench", ["--quick", "--out", "/tmp/x"])]


def test_probe_without_a_gpu_exits_1_saying_so(capsys, monkeypatch):
    """2 means a bad option; a machine without a GPU is not one."""
    from dispatch.benchmark import probe

    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    assert cli.main(["probe"]) == 1
    assert "probe needs a CUDA GPU; this machine has none" in capsys.readouterr().err


# -- what a new user meets first: --version, JSON that parses, pipes, wrapped text ------------------
def _attn_dispatch(*argv, pipe_to=None):
    """The command as a user runs it (a fresh interpreter), optionally piped into another command."""
    import subprocess

    cmd = [sys.executable, "-m", "dispatch", *argv]
    if pipe_to is None:
        return subprocess.run(cmd, cwd=cli.REPO_ROOT, capture_output=True, text=True, timeout=120)
    shell = " ".join(map(repr, cmd)) + " | " + pipe_to
    return subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=cli.REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_version_prints_the_package_version():
    done = _attn_dispatch("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"attn-dispatch {cli.version()}"
    assert cli.version()[0].isdigit() or cli.version().startswith("unknown")


@pytest.mark.parametrize("command", ["matrix", "info", "query --gpu h100 --causal", "probe --list"])
def test_piping_into_head_ends_quietly(command):
    done = _attn_dispatch(*command.split(), pipe_to="head -1")
    assert done.returncode == 0, done.stderr
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
    assert len(done.stdout.splitlines()) == 1


def test_probe_json_prints_only_json_even_without_a_gpu():
    done = _attn_dispatch("probe", "--json")
    data = json.loads(done.stdout)
    if not torch.cuda.is_available():  # 1: the machine lacks a GPU; 2 is kept for a bad option
        assert done.returncode == 1 and data["error"] == "no CUDA device"
    done = _attn_dispatch("probe", "--list", "--json")
    assert done.returncode == 0 and {"case", "problem"} <= set(json.loads(done.stdout)[0])


def test_probe_unknown_backend_exits_2_naming_the_option_and_the_valid_names(capsys, monkeypatch):
    from dispatch.benchmark import probe

    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as info:
        probe.main(["--backends", "nope", "--cases", "none"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--backends 'nope'" in err and "cudnn" in err


def _widths(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 100]


@pytest.mark.parametrize("command", ["", "info", "query", "explain", "matrix", "probe", "bench"])
def test_help_fits_100_columns_and_names_no_missing_script(command):
    import subprocess

    argv = [sys.executable, "-m", "dispatch", *command.split(), "--help"]
    done = subprocess.run(argv, cwd=cli.REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "COLUMNS": "100"})
    assert done.returncode == 0 and done.stdout.startswith("usage: attn-dispatch"), done.stderr
    assert not _widths(done.stdout)
    assert "tools/bench" not in done.stdout and "``" not in done.stdout


def test_probe_list_fits_100_columns():
    done = _attn_dispatch("probe", "--list")
    assert done.returncode == 0 and len(done.stdout.splitlines()) > 30
    assert not _widths(done.stdout)


def test_bench_quick_prints_a_summary_that_fits_100_columns(tmp_path):
    """What a new user sees from `attn-dispatch bench --device cpu --quick`: the regret line and one
    row per problem within 100 columns on stdout (the wide table is the .md), progress on stderr."""
    done = _attn_dispatch("bench", "--device", "cpu", "--quick", "--limit", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert not _widths(done.stdout) and not _widths(done.stderr)
    lines = done.stdout.splitlines()
    assert lines[0] == "attn-dispatch bench: quick on CPU, 3 problems" and "Regret of the automatic choice" in lines[1]
    rep = json.loads((tmp_path / "bench-quick-cpu.json").read_text())
    for r in rep["results"]:
        assert any(line.startswith(r["name"]) and r["fastest"] in line for line in lines), r["name"]
    outputs = lines[lines.index("outputs:") + 1:]  # the plots too where matplotlib (the bench extra) is installed
    assert outputs[:2] == [f"  {tmp_path / 'bench-quick-cpu.json'}", f"  {tmp_path / 'bench-quick-cpu.md'}"]
    assert all(line.startswith(f"  {tmp_path / 'bench-quick-cpu'}") for line in outputs)


def test_bench_piped_into_head_ends_quietly(tmp_path):
    done = _attn_dispatch("bench", "--device", "cpu", "--quick", "--limit", "2", "--out", str(tmp_path),
                          pipe_to="head -3")
    assert done.returncode == 0, done.stderr
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
    assert len(done.stdout.splitlines()) == 3


@pytest.mark.parametrize("command", ["--version", "explain --causal", "info --json", "bench --list --quick"])
def test_more_commands_piped_into_head_end_quietly(command):
    done = _attn_dispatch(*command.split(), pipe_to="head -3")
    assert done.returncode == 0, done.stderr
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
    assert 1 <= len(done.stdout.splitlines()) <= 3


def test_info_never_suggests_an_extra_pyproject_does_not_have():
    import re
    import tomllib

    extras = set(tomllib.loads((cli.REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    done = _attn_dispatch("info")
    named = set(re.findall(r"attn-dispatch\[(\w+)\]", done.stdout))
    assert named and named <= extras, named - extras
