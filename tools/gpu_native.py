"""GPU check + benchmark of the native-triton backend, in one call on the device machine.

1. environment (GPU, torch, triton, date);
2. agreement vs a float64 oracle over GPU-sized scenarios (paged NHD/HND, pages 1/5/16,
   GQA 32/8, causal, window / soft cap / sinks, fp8 KV, spec decode, head dims
   64/96/128/192-128/256), reusing the scenarios, builders and oracle of dispatch/lab_native.py;
3. benchmark (bf16, 32 q heads / 8 kv heads, d128, pages of 16) against PyTorch's FA2
   (torch.ops.aten._flash_attention_forward on equivalent dense inputs), with a small
   sweep of tile configs on the two anchor workloads.

Usage: python tools/gpu_native.py [OUT_DIR] [--quick]. Writes native-triton-h100.json/.md into
OUT_DIR (default $OUT); prints a short table last.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.native.triton_backend import NativeTritonBackend, TileConfig  # noqa: E402
from dispatch.lab_native import Case, run_case, spec_bits  # noqa: E402
from dispatch.problem import NAME_DTYPES, AttentionBatch, AttentionProblem  # noqa: E402

BACKEND = NativeTritonBackend()
HQ, HKV, D, PAGE = 32, 8, 128, 16
DEC = dict(phase="decode", causal=True)


def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "sm": f"{props.major}{props.minor}",
            "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}


# ---------------------------------------------------------------------------
# agreement
# ---------------------------------------------------------------------------
AGREEMENT = {
    "paged_nhd_p16_causal_gqa4_bf16": Case(hq=32, hkv=8, dqk=128, dvo=128, page_size=16, dtype="bfloat16",
                                           q_lens=(37, 300, 1), kv_lens=(900, 1500, 2000)),
    "paged_hnd_p5_causal_fp16": Case(layout="HND", page_size=5, hq=8, hkv=2, dqk=128, dvo=128,
                                     q_lens=(64, 129), kv_lens=(500, 129)),
    "paged_p1_decode_d64": Case(page_size=1, hq=16, hkv=4, q_lens=(1,) * 5, kv_lens=(1, 77, 600, 2048, 3000),
                                dtype="bfloat16", **DEC),
    "decode_d96_p16": Case(page_size=16, hq=32, hkv=8, dqk=96, dvo=96, q_lens=(1,) * 4,
                           kv_lens=(4000, 17, 333, 1024), dtype="bfloat16", **DEC),
    "prefill_d192_dv128_ragged": Case(storage="ragged", hq=16, hkv=16, dqk=192, dvo=128, dtype="bfloat16",
                                      q_lens=(200, 77), kv_lens=(200, 300)),
    "prefill_d256_paged": Case(page_size=16, hq=8, hkv=2, dqk=256, dvo=256, dtype="bfloat16",
                               q_lens=(100, 3), kv_lens=(260, 1000)),
    "window_softcap_sinks_prefill": Case(page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16",
                                         q_lens=(256, 50), kv_lens=(1024, 700), window_left=127,
                                         soft_cap=30.0, sinks=True),
    "window_softcap_sinks_decode": Case(page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16",
                                        q_lens=(1,) * 3, kv_lens=(5000, 900, 64), window_left=511,
                                        soft_cap=30.0, sinks=True, **DEC),
    "fp8_e4m3_decode_hnd": Case(layout="HND", page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16",
                                kv_dtype="float8_e4m3fn", q_lens=(1,) * 4, kv_lens=(4096, 100, 2500, 9),
                                **DEC),
    "fp8_e4m3_prefill": Case(page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16",
                             kv_dtype="float8_e4m3fn", q_lens=(128, 9), kv_lens=(600, 9)),
    "spec_decode_q4": Case(phase="spec_decode", mask="spec_bits", causal=False, page_size=16, hq=32, hkv=8,
                           dqk=128, dvo=128, dtype="bfloat16", q_lens=(4,) * 4, kv_lens=(3000, 40, 777, 4),
                           q_len_per_req=4),
    "custom_mask_ragged": Case(storage="ragged", mask="custom", causal=False, hq=8, hkv=2, dqk=128, dvo=128,
                               q_lens=(70, 5), kv_lens=(120, 300), dtype="bfloat16"),
    "alibi_rope_ragged": Case(storage="ragged", pos="ROPE_LLAMA", hq=8, hkv=8, dqk=128, dvo=128,
                              q_lens=(90, 2), kv_lens=(300, 40)),
    "alibi_paged": Case(pos="ALIBI", page_size=16, hq=12, hkv=12, dqk=64, dvo=64, q_lens=(50,), kv_lens=(400,)),
    "fp32_dense": Case(storage="dense", dtype="float32", hq=4, hkv=1, q_lens=(100,), kv_lens=(180,)),
}


def agreement() -> list[dict]:
    rows = []
    for name, case in AGREEMENT.items():
        for splits in (None, 4) if case.phase != "prefill" else (None,):
            label = name + ("" if splits is None else f"_split{splits}")
            try:
                plan, err, lerr = run_case(case, num_splits=splits)
                rows.append({"scenario": label, "ok": True, "out_rel_err": err, "lse_rel_err": lerr,
                             "splits": plan.num_splits})
            except Exception as exc:  # noqa: BLE001 - record and go on
                rows.append({"scenario": label, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]})
                traceback.print_exc()
    return rows


# ---------------------------------------------------------------------------
# benchmark
# ---------------------------------------------------------------------------
def paged_workload(b, q_len, kv_len, *, causal=True, phase="prefill", window=-1, cap=0.0, sinks=False,
                   kv_dtype="bfloat16", mask="none", storage="paged"):
    """(problem, batch) with random bf16 data in a paged NHD cache, pages shuffled (or ragged)."""
    ppr = math.ceil(kv_len / PAGE)
    dt = torch.bfloat16
    kvt = NAME_DTYPES[kv_dtype]
    k = torch.randn(b * ppr, PAGE, HKV, D, device="cuda", dtype=dt).to(kvt)
    v = torch.randn(b * ppr, PAGE, HKV, D, device="cuda", dtype=dt).to(kvt)
    table = torch.randperm(b * ppr, device="cuda", dtype=torch.int32).view(b, ppr)
    q = torch.randn(b * q_len, HQ, D, device="cuda", dtype=dt)
    problem = AttentionProblem(entry="bench", phase=phase, kv_storage="paged", kv_layout="NHD", num_qo_heads=HQ,
                               num_kv_heads=HKV, head_dim_qk=D, head_dim_vo=D, q_dtype="bfloat16",
                               kv_dtype=kv_dtype, out_dtype="bfloat16", page_size=PAGE, causal=causal,
                               window_left=window, logits_soft_cap=cap, has_sinks=sinks, mask=mask,
                               q_len_per_req=q_len if mask == "spec_bits" else 0)
    extra = {"block_table": table}
    if storage == "ragged":  # the same keys, contiguous per request
        k, v = k.view(-1, HKV, D)[: b * kv_len], v.view(-1, HKV, D)[: b * kv_len]
        extra = {"kv_indptr": torch.arange(0, b * kv_len + 1, kv_len, device="cuda", dtype=torch.int32)}
        problem = replace(problem, kv_storage="ragged", page_size=0)
    if mask == "spec_bits":
        bits = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool, device="cuda")).expand(b, q_len, q_len)
        extra["spec_mask"] = spec_bits(bits)
    batch = AttentionBatch(
        q=q, k=k, v=v, out=torch.empty_like(q),
        qo_indptr=torch.arange(0, b * q_len + 1, q_len, device="cuda", dtype=torch.int32),
        kv_lens=torch.full((b,), kv_len, device="cuda", dtype=torch.int32), batch_size=b, max_q_len=q_len,
        max_kv_len=kv_len, sm_scale=1 / math.sqrt(D), lse=torch.empty(b * q_len, HQ, device="cuda"),
        sinks=torch.rand(HQ, device="cuda") * 5 if sinks else None, **extra)
    return problem, batch


def bench_ms(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_native(problem, batch, config=None, num_splits=None) -> dict:
    plan = BACKEND.plan(problem, batch, config=config, num_splits=num_splits)
    BACKEND.run(plan, batch)  # compile
    torch.cuda.synchronize()
    eager = bench_ms(lambda: BACKEND.run(plan, batch))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        BACKEND.run(plan, batch)
    replay = bench_ms(graph.replay)
    c = plan.config
    return {"eager_ms": eager, "graph_ms": replay, "splits": plan.num_splits,
            "config": f"M{c.block_m} N{c.block_n} hpp{c.heads_per_program} w{c.num_warps} s{c.num_stages}"}


def time_fa2(b, q_len, kv_len, causal, window=-1, cap=0.0) -> dict:
    """PyTorch's FA2 on dense (B, S, H, D) inputs with native GQA (8 kv heads)."""
    if cap > 0:
        return {"fa2_ms": None, "fa2_note": "aten FA2 has no soft cap"}
    q = torch.randn(b, q_len, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, kv_len, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kw = {"scale": 1 / math.sqrt(D)}
    if window >= 0:
        kw.update(window_size_left=window, window_size_right=0)
    op = torch.ops.aten._flash_attention_forward
    try:
        fn = lambda: op(q, k, v, None, None, q_len, kv_len, 0.0, causal, False, **kw)  # noqa: E731
        fn()
        return {"fa2_ms": bench_ms(fn)}
    except Exception as exc:  # noqa: BLE001
        return {"fa2_ms": None, "fa2_note": f"{type(exc).__name__}: {str(exc)[:200]}"}


def kv_bytes(b, kv_len, elem=2) -> int:
    return 2 * b * kv_len * HKV * D * elem


def causal_flops(b, s) -> float:
    return 4.0 * b * HQ * D * (s * s / 2)


BENCH = [  # name, workload kwargs, metric
    ("decode b64 x 4096", dict(b=64, q_len=1, kv_len=4096, phase="decode"), "kv"),
    ("decode b1 x 32768", dict(b=1, q_len=1, kv_len=32768, phase="decode"), "kv"),
    ("decode b1 x 131072", dict(b=1, q_len=1, kv_len=131072, phase="decode"), "kv"),
    ("decode b4 x 65536", dict(b=4, q_len=1, kv_len=65536, phase="decode"), "kv"),
    ("decode b64 x 4096 fp8 KV", dict(b=64, q_len=1, kv_len=4096, phase="decode", kv_dtype="float8_e4m3fn"), "kv8"),
    ("decode b64 x 4096 win1023+cap30+sinks", dict(b=64, q_len=1, kv_len=4096, phase="decode", window=1023,
                                                  cap=30.0, sinks=True), "win"),
    ("spec decode b64 q4 x 4096", dict(b=64, q_len=4, kv_len=4096, phase="spec_decode", causal=False,
                                       mask="spec_bits"), "kv"),
    ("prefill causal 8 x 2048", dict(b=8, q_len=2048, kv_len=2048), "flops"),
    ("prefill causal 8 x 2048 ragged", dict(b=8, q_len=2048, kv_len=2048, storage="ragged"), "flops"),
    ("prefill causal 8 x 2048 win512+cap30+sinks", dict(b=8, q_len=2048, kv_len=2048, window=512, cap=30.0,
                                                        sinks=True), "none"),
    ("prefill causal 1 x 16384", dict(b=1, q_len=16384, kv_len=16384), "flops"),
]


def metric(kind, w, ms) -> tuple[str, float]:
    if kind == "kv":
        return "TB/s", kv_bytes(w["b"], w["kv_len"]) / ms / 1e9
    if kind == "kv8":
        return "TB/s", kv_bytes(w["b"], w["kv_len"], 1) / ms / 1e9
    if kind == "win":
        return "TB/s", kv_bytes(w["b"], min(w["kv_len"], w["window"] + 1)) / ms / 1e9
    if kind == "flops":
        return "TFLOP/s", causal_flops(w["b"], w["q_len"]) / ms / 1e9
    return "ms", ms


def benchmark(quick: bool) -> list[dict]:
    rows = []
    for name, w, kind in BENCH:
        try:
            problem, batch = paged_workload(**w)
            r = {"case": name, **time_native(problem, batch)}
            best = min(r["eager_ms"], r["graph_ms"])
            r["unit"], r["native"] = metric(kind, w, best)
            fa = time_fa2(w["b"], w["q_len"], w["kv_len"], w.get("causal", True), w.get("window", -1),
                          w.get("cap", 0.0)) if w.get("mask", "none") == "none" and not w.get("sinks") \
                and w.get("kv_dtype", "bfloat16") == "bfloat16" else {"fa2_ms": None, "fa2_note": "n/a"}
            r.update(fa)
            if fa.get("fa2_ms"):
                r["fa2"] = metric(kind, w, fa["fa2_ms"])[1]
            rows.append(r)
            del problem, batch
        except Exception as exc:  # noqa: BLE001
            rows.append({"case": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            traceback.print_exc()
        torch.cuda.empty_cache()
    return rows


SWEEP = {  # the tile/split sweeps of earlier runs are in tools/results/native-triton-h100-sweep*.md
    "decode b1 x 131072": [(TileConfig(16, 128, 4, 4, 3), sp) for sp in (16, 32, 64)],
}


def sweep() -> list[dict]:
    rows = []
    cases = {name: (w, kind) for name, w, kind in BENCH}
    for name, configs in SWEEP.items():
        w, kind = cases[name]
        problem, batch = paged_workload(**w)
        for cfg, splits in configs:
            try:
                r = time_native(problem, batch, cfg, splits)
                r["unit"], r["value"] = metric(kind, w, min(r["eager_ms"], r["graph_ms"]))
                rows.append({"case": name, **r})
            except Exception as exc:  # noqa: BLE001
                rows.append({"case": name, "config": str(cfg), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        del problem, batch
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def fmt(x, nd=3, sci=False) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}e}" if sci else f"{x:.{nd}f}"
    return str(x)


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# native-triton on {env['gpu']} (sm_{env['sm']})", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, {env['date']}", "",
             "## Agreement vs float64", "", "| scenario | ok | out rel err | lse rel err | splits |",
             "|---|---|---|---|---|"]
    for r in report["agreement"]:
        lines.append(f"| {r['scenario']} | {r['ok']} | {fmt(r.get('out_rel_err'), 2, True) if r['ok'] else r['error']} | "
                     f"{fmt(r.get('lse_rel_err'), 2, True) if r['ok'] else ''} | {r.get('splits', '')} |")
    lines += ["", f"pytest tests/test_native_triton.py on the GPU: {report.get('pytest', 'not run')}", "",
              "## Benchmark (bf16, 32/8 heads, d128, pages of 16; do_bench median)", "",
              "| case | native ms (eager / graph) | native | FA2 ms | FA2 | unit | config | splits |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report["benchmark"]:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} |||||||")
            continue
        lines.append(f"| {r['case']} | {fmt(r['eager_ms'])} / {fmt(r['graph_ms'])} | {fmt(r['native'], 2)} | "
                     f"{fmt(r.get('fa2_ms'))} | {fmt(r.get('fa2'), 2)} | {r['unit']} | {r['config']} | "
                     f"{r['splits']} |")
    lines += ["", "## Tile sweep", "", "| case | config | splits | eager ms | graph ms | value |", "|---|---|---|---|---|---|"]
    for r in report["sweep"]:
        lines.append(f"| {r['case']} | {r.get('config')} | {r.get('splits', '')} | {fmt(r.get('eager_ms'))} | "
                     f"{fmt(r.get('graph_ms'))} | {fmt(r.get('value'), 2)} {r.get('unit', r.get('error', ''))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = Path(args[0] if args else os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    report = {"environment": environment(), "pytest": os.environ.get("PYTEST_SUMMARY", "not run")}
    report["agreement"] = agreement()
    report["benchmark"] = benchmark("--quick" in sys.argv)
    report["sweep"] = [] if "--no-sweep" in sys.argv else sweep()
    (out_dir / "native-triton-h100.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (out_dir / "native-triton-h100.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
