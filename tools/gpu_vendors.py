"""Run the xqa, fa2 and fa3 adapters for real on a GPU (FlashInfer providers): agreement and speed.

Usage on the device machine (after installing the .whl wheels, see /tmp/briefs/gpu.md):
    FLASHINFER_WORKSPACE_BASE=/tmp/fi python3 tools/gpu_vendors.py --out $OUT [--budget-s 480]

1. Agreement: each case goes through our adapter (plan + run), output compared with an
   fp64 oracle of our semantics (dispatch/lab_vendors.py ``reference``) by relative
   Frobenius error; out is poisoned with NaN first and must be fully written.
   Includes out_scale (bmm2_scale) = 0.7, window, sinks, fp8 KV, HND, LSE base 2, and the
   raw FlashInfer xqa call with bmm2_scale = 0.7 to show what the adapter compensates.
2. Benchmark: bf16, 32/8 heads, d128, pages of 16: decode 64 x 4096 (TB/s of KV read) and
   causal prefill 8 x 2048 (TFLOP/s), CUDA-event median, plan outside the timed region.
Cases are skipped (recorded as such) once --budget-s is spent: first-use JIT is slow.
Writes vendors-<gpu>.json and .md into --out; prints a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _gpu_common import time_ms  # noqa: E402  (tools/ is sys.path[0])
from backends import BackendRejected, get_backend  # noqa: E402
from dispatch.lab_vendors import make_batch, make_problem, reference  # noqa: E402

BANDS = {"bfloat16": 1e-2, "float16": 1e-2, "float8_e4m3fn": 6e-2}
HEADS = dict(num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_vo=128)
START = time.time()
DEVICE = "cuda"  # tests may point it at "cpu" with fake vendor modules


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def rel_err(out, ref) -> float:
    return float((out.double().cpu() - ref).norm() / ref.norm())


def agreement(name, backend, problem_kw, q_lens, kv_lens, **batch_kw) -> dict:
    problem = make_problem(device_type="cuda", **HEADS, **problem_kw)
    batch, refs = make_batch(problem, q_lens, kv_lens, device=DEVICE, **batch_kw)
    row = {"case": name, "backend": backend, "problem": problem.describe()}
    t0 = time.time()
    try:
        be = get_backend(backend)
        be.run(be.plan(problem, batch), batch)
        sync()
    except BackendRejected as exc:
        return {**row, "result": "rejected at plan", "detail": str(exc)[:300]}
    row["seconds"] = round(time.time() - t0, 1)  # includes first-use JIT
    out_ref, lse_ref = reference(problem, batch, refs)
    unwritten = int(torch.isnan(batch.out).sum())
    err = rel_err(batch.out, out_ref)
    band = BANDS[problem.kv_dtype]
    row.update(rel_err=err, band=band, unwritten=unwritten)
    ok = unwritten == 0 and err < band
    if batch.lse is not None:
        lse = batch.lse.double().cpu()
        fin = torch.isfinite(lse_ref)
        row["lse_rel_err"] = float((lse[fin] - lse_ref[fin]).norm() / lse_ref[fin].norm())
        row["lse_inf_match"] = bool(torch.equal(torch.isinf(lse), torch.isinf(lse_ref)))
        ok = ok and row["lse_rel_err"] < 1e-3 and row["lse_inf_match"]
    row["result"] = "pass" if ok else "FAIL"
    return row


def xqa_raw_bmm2(kv_dtype) -> dict:
    """FlashInfer's xqa called directly with bmm2_scale = 0.7 (no adapter): what 0.5.3 does."""
    import flashinfer.decode as fid
    problem = make_problem(device_type="cuda", phase="decode", kv_dtype=kv_dtype, **HEADS)
    batch, refs = make_batch(problem, [1] * 4, [77, 300, 513, 64], out_scale=0.7, device=DEVICE, seed=3)
    ws = torch.zeros(128 * 2 ** 20, dtype=torch.uint8, device=DEVICE)
    fid.xqa_batch_decode_with_kv_cache(batch.q, (batch.k, batch.v), ws, batch.block_table, batch.kv_lens,
                                       batch.max_kv_len, 0.11, 0.7, out=batch.out)
    sync()
    err = rel_err(batch.out, reference(problem, batch, refs)[0])
    return {"case": f"raw flashinfer xqa, bmm2_scale=0.7, {kv_dtype} KV (no adapter)", "backend": "flashinfer",
            "rel_err": err, "band": BANDS[kv_dtype],
            "result": "vendor wrong" if err >= BANDS[kv_dtype] else "vendor right"}


AGREEMENT = [
    # (name, backend, problem kwargs, q_lens, kv_lens, batch kwargs)
    ("xqa decode", "xqa", dict(phase="decode"), [1] * 4, [77, 300, 513, 64], {}),
    ("xqa decode out_scale=0.7", "xqa", dict(phase="decode"), [1] * 4, [77, 300, 513, 64], dict(out_scale=0.7)),
    ("xqa decode out_scale=0.7 tensor, HND", "xqa", dict(phase="decode", kv_layout="HND"), [1] * 4,
     [77, 300, 513, 64], dict(out_scale=torch.tensor(0.7))),
    ("xqa decode sinks", "xqa", dict(phase="decode", has_sinks=True), [1] * 4, [77, 300, 513, 64], dict(sinks=True)),
    ("xqa decode fp8 KV out_scale=0.7", "xqa", dict(phase="decode", kv_dtype="float8_e4m3fn"), [1] * 4,
     [77, 300, 513, 64], dict(out_scale=0.7)),
    ("xqa decode window 63 + sinks", "xqa", dict(phase="decode", window_left=63, has_sinks=True), [1] * 4,
     [77, 300, 513, 64], dict(sinks=True, out_scale=0.7)),
    ("xqa spec decode q_len 3", "xqa", dict(phase="spec_decode", q_len_per_req=3, causal=True), [3] * 3,
     [40, 100, 7], {}),
    ("fa2 paged causal prefill + LSE, out_scale=0.7", "fa2", dict(causal=True, return_lse=True),
     [1, 17, 128, 300], [40, 17, 600, 300], dict(out_scale=0.7, lse=True)),
    ("fa2 paged HND causal prefill + LSE", "fa2", dict(causal=True, return_lse=True, kv_layout="HND"),
     [1, 17, 128, 300], [40, 17, 600, 300], dict(lse=True)),
    ("fa2 decode (q_len 1)", "fa2", dict(phase="decode"), [1] * 4, [77, 300, 513, 64], dict(out_scale=0.7)),
    ("fa2 ragged custom mask + LSE", "fa2", dict(kv_storage="ragged", mask="custom", return_lse=True),
     [5, 64], [70, 64], dict(custom_mask=True, lse=True)),
    ("fa3 paged causal prefill + LSE, out_scale=0.7", "fa3", dict(causal=True, return_lse=True),
     [1, 17, 128, 300], [40, 17, 600, 300], dict(out_scale=0.7, lse=True)),
    ("fa3 paged HND causal prefill", "fa3", dict(causal=True, kv_layout="HND"), [1, 17, 128, 300],
     [40, 17, 600, 300], {}),
    ("fa3 ragged causal + LSE", "fa3", dict(kv_storage="ragged", causal=True, return_lse=True), [33, 200],
     [100, 200], dict(lse=True)),
    # below: each needs one more JIT module (skipped when the budget is spent)
    ("fa2 window 63 + soft cap 30 + LSE", "fa2", dict(causal=True, window_left=63, logits_soft_cap=30.0,
     return_lse=True), [1, 17, 128, 300], [40, 17, 600, 300], dict(lse=True, out_scale=0.7)),
    ("fa2 decode fp8 e4m3 KV", "fa2", dict(phase="decode", kv_dtype="float8_e4m3fn"), [1] * 4,
     [77, 300, 513, 64], dict(out_scale=0.7)),
    ("fa3 window 63 + soft cap 30 + LSE", "fa3", dict(causal=True, window_left=63, logits_soft_cap=30.0,
     return_lse=True), [1, 17, 128, 300], [40, 17, 600, 300], dict(lse=True)),
]


# -- benchmark -------------------------------------------------------------------------------
def bench_batch(phase: str):
    """bf16 32/8 heads d128 pages of 16, random page permutation, built on the GPU."""
    from dispatch.problem import AttentionBatch
    b, lq, lk = (64, 1, 4096) if phase == "decode" else (8, 2048, 2048)
    p, dev = 16, "cuda"
    problem = make_problem(device_type="cuda", phase=phase, causal=True, **HEADS)
    pages = b * lk // p
    k = torch.randn(pages, p, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device=dev, dtype=torch.int32).reshape(b, lk // p)
    q = torch.randn(b * lq, 32, 128, device=dev, dtype=torch.bfloat16)
    batch = AttentionBatch(q=q, k=k, v=v, qo_indptr=torch.arange(b + 1, device=dev, dtype=torch.int32) * lq,
                           kv_lens=torch.full((b,), lk, device=dev, dtype=torch.int32), out=torch.empty_like(q),
                           batch_size=b, max_q_len=lq, max_kv_len=lk, sm_scale=128 ** -0.5, block_table=table)
    if phase == "decode":
        work, unit = 2 * k.numel() * k.element_size() + 2 * q.numel() * 2, "TB/s"
    else:
        work, unit = 4 * b * 32 * 128 * (lk * (lk + 1) // 2), "TFLOP/s"
    return problem, batch, work, unit




def bench(phase, backend) -> dict:
    problem, batch, work, unit = bench_batch(phase)
    row = {"bench": f"{phase} " + ("64 x 4096" if phase == "decode" else "8 x 2048 causal"), "backend": backend}
    be = get_backend(backend)
    missing = be.available()
    if missing is not None:
        return {**row, "result": f"not available: {missing}"}
    try:
        plan = be.plan(problem, batch)
        ms = time_ms(lambda: be.run(plan, batch))
    except BackendRejected as exc:
        return {**row, "result": f"rejected: {exc}"[:200]}
    rate = work / (ms * 1e-3) / 1e12
    return {**row, "ms": round(ms, 4), unit: round(rate, 3), "result": "ok"}


# -- driver ----------------------------------------------------------------------------------
def guarded(rows, budget, fn, label):
    if time.time() - START > budget:
        rows.append({"case": label, "result": "skipped (time budget)"})
        return
    try:
        rows.append(fn())
    except Exception as exc:  # a crash is a result to report, not a reason to lose the others
        rows.append({"case": label, "result": "ERROR", "detail": f"{type(exc).__name__}: {exc}"[:400]})
        traceback.print_exc()
    print(json.dumps(rows[-1], default=str), flush=True)


def environment() -> dict:
    import flashinfer
    return {"gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "flashinfer": flashinfer.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def markdown(env, agree, perf) -> str:
    lines = [f"# Vendor adapters on {env['gpu']} (sm_{env['capability'][0]}{env['capability'][1]})", "",
             f"{env['date']}; torch {env['torch']} (CUDA {env['cuda']}), flashinfer {env['flashinfer']}, "
             f"Python {env['python']}. Produced by `tools/gpu_vendors.py`.", "",
             "## Agreement with the fp64 oracle (rel. Frobenius error of out; LSE base 2)", "",
             "| case | backend | rel. err | band | LSE rel. err | result |", "|---|---|---|---|---|---|"]
    for r in agree:
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else ""
        lse = f"{r['lse_rel_err']:.1e}" if "lse_rel_err" in r else ""
        res = r["result"] + (f": {r['detail']}" if "detail" in r else "")
        lines.append(f"| {r['case']} | {r.get('backend', '')} | {err} | {r.get('band', '')} | {lse} | {res} |")
    lines += ["", "## Benchmark (bf16, 32/8 heads, d128, pages of 16; CUDA-event median of 30)", "",
              "| bench | backend | ms | rate | result |", "|---|---|---|---|---|"]
    for r in perf:
        rate = f"{r['TB/s']} TB/s" if "TB/s" in r else (f"{r['TFLOP/s']} TFLOP/s" if "TFLOP/s" in r else "")
        lines.append(f"| {r.get('bench', r.get('case'))} | {r.get('backend', '')} | {r.get('ms', '')} | {rate} | "
                     f"{r['result']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=480)
    args = ap.parse_args()
    env = environment()
    print(json.dumps(env), flush=True)
    agree, perf = [], []
    cases = AGREEMENT[:14]
    for name, backend, pkw, ql, kl, bkw in cases:
        guarded(agree, args.budget_s, lambda: agreement(name, backend, pkw, ql, kl, **bkw), name)
    for kv in ("bfloat16", "float8_e4m3fn"):
        guarded(agree, args.budget_s, lambda: xqa_raw_bmm2(kv), f"raw xqa {kv}")
    for phase, backends in (("decode", ("xqa", "fa2", "fa3", "native-triton")),
                            ("prefill", ("fa3", "fa2", "native-triton"))):
        for backend in backends:
            guarded(perf, args.budget_s, lambda: bench(phase, backend), f"bench {phase} {backend}")
    for name, backend, pkw, ql, kl, bkw in AGREEMENT[14:]:
        guarded(agree, args.budget_s, lambda: agreement(name, backend, pkw, ql, kl, **bkw), name)
    tag = env["gpu"].split()[1].lower() if len(env["gpu"].split()) > 1 else "gpu"
    out = Path(args.out)
    (out / f"vendors-{tag}.json").write_text(json.dumps({"environment": env, "agreement": agree, "benchmark": perf},
                                                       indent=1, default=str))
    md = markdown(env, agree, perf)
    (out / f"vendors-{tag}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
