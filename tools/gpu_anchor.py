"""Every GPU backend side by side, in one run, on the anchor workloads (the issues' targets).

bf16, 32 query / 8 KV heads, head dim 128, pages of 16 (torch-flash takes the same keys as a
ragged KV, since it has no paging). For each (workload, backend) the script plans and runs the
backend through its adapter (the same path the router takes), checks the output against
float64 (rel. Frobenius error; bf16 band 1e-2), then times run() (CUDA events, median) and,
where the backend declares CUDA-graph support, a captured replay that must equal eager.

    python tools/gpu_anchor.py [OUT_DIR]     # writes anchor.json + anchor.md, table last
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _gpu_common import time_ms  # noqa: E402  (tools/ is sys.path[0])
from backends import REGISTRY, BackendRejected, get_backend  # noqa: E402
from dispatch import probe  # noqa: E402
from dispatch.probe import Case, make_batch, oracle, rel_error  # noqa: E402
from dispatch.router import backend_reasons, live_device  # noqa: E402

# every GPU backend of the registry (the data files): a new backend shows up here by itself
BACKENDS = tuple(name for name in REGISTRY if name != "reference")
BASE = probe.BASE.__class__(
    entry="anchor", phase="decode", kv_storage="paged", kv_layout="NHD", num_qo_heads=32, num_kv_heads=8,
    head_dim_qk=128, head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16", page_size=16)


def workloads() -> list[Case]:
    decode = lambda b, n: Case(f"decode {b} x {n}", BASE, (1,) * b, (n,) * b)  # noqa: E731
    prefill = replace(BASE, phase="prefill", causal=True)
    features = replace(BASE, causal=True, window_left=1023, logits_soft_cap=30.0, has_sinks=True)
    return [decode(64, 4096), Case("prefill causal 8 x 2048", prefill, (2048,) * 8, (2048,) * 8),
            decode(1, 131072), decode(4, 32768),
            Case("decode 64 x 4096 window 1023 + soft cap 30 + sinks", features, (1,) * 64, (4096,) * 64)]




def rate(case: Case, ms: float) -> str:
    p = case.problem
    if p.phase == "decode":  # keys actually read: a window reads window_left + 1 of them
        keys = sum(min(n, p.window_left + 1) if p.window_left >= 0 else n for n in case.kv_lens)
        kv_bytes = keys * p.num_kv_heads * (p.head_dim_qk + p.head_dim_vo) * 2
        return f"{kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s"
    pairs = sum(q * (q + 1) / 2 for q in case.q_lens)
    return f"{2 * pairs * p.num_qo_heads * (p.head_dim_qk + p.head_dim_vo) / (ms * 1e-3) / 1e12:.0f} TFLOP/s"


def graph_equals_eager(backend, plan, batch) -> str:
    eager = batch.out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.run(plan, batch)
    batch.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(batch.out, eager)
    return ("replay == eager, " + f"{time_ms(graph.replay):.3f} ms replayed") if same else "REPLAY DIFFERS"


def served_case(name: str, case: Case) -> Case:
    """A backend whose data refuses paged KV (torch-flash) gets the workload with ragged KV storage."""
    return probe.as_ragged_if_paged_only_reason(name, case, live_device(torch.empty(0, device="cuda")),
                                                backend_reasons)


def measure(name: str, case: Case, refs: dict) -> dict:
    row = {"workload": case.name, "backend": name}
    case = served_case(name, case)
    backend = get_backend(name)
    missing = backend.available()
    reasons = [missing] if missing else backend.check(case.problem, live_device(torch.empty(0, device="cuda")))
    if reasons:
        return {**row, "status": "rejected", "note": "; ".join(map(str, reasons))[:200]}
    batch = make_batch(case, torch.device("cuda"), seed=11)
    try:
        plan = backend.plan(case.problem, batch)
    except BackendRejected as exc:
        return {**row, "status": "rejected at plan", "note": str(exc)[:200]}
    backend.run(plan, batch)
    torch.cuda.synchronize()
    key = case.problem.kv_storage  # seed 11 draws different tensors for paged and ragged storage
    if key not in refs:
        refs[key] = reference_of(case)
    row["rel_err"] = rel_error(batch.out, refs[key])
    row["ms"] = time_ms(lambda: backend.run(plan, batch))
    row["rate"] = rate(case, row["ms"])
    row["status"] = "ok" if row["rel_err"] < 1e-2 else "DISAGREES"
    if backend.caps.cuda_graph != "never":
        row["graph"] = graph_equals_eager(backend, plan, batch)
    return row


def reference_of(case: Case):
    """fp64 output of the case's inputs (seed 11: the same tensors every backend gets)."""
    batch = make_batch(case, torch.device("cuda"), seed=11)
    out, _ = oracle(case.problem, batch)
    return out


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "tools/results")
    env = probe.environment()
    env.update({n: get_backend(n).version() for n in BACKENDS})
    rows = []
    for case in workloads():
        refs: dict = {}
        for name in BACKENDS:
            t0 = time.perf_counter()
            try:
                row = measure(name, case, refs)
            except Exception as exc:  # noqa: BLE001 - report the failure, keep measuring the rest
                row = {"workload": case.name, "backend": name, "status": "ERROR", "note": f"{type(exc).__name__}: {exc}"[:300]}
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del refs
        torch.cuda.empty_cache()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "anchor.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1, default=str))
    table = markdown(env, rows)
    (out_dir / "anchor.md").write_text(table)
    print(table)
    return 0


def markdown(env: dict, rows: list[dict]) -> str:
    lines = ["# Anchor workloads, every backend side by side", "",
             *(f"- {k}: {v}" for k, v in env.items()), "",
             "| workload | backend | status | rel err vs fp64 | ms | rate | CUDA graph | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        ms = f"{r['ms']:.3f}" if "ms" in r else ""
        lines.append(f"| {r['workload']} | {r['backend']} | {r['status']} | {err} | {ms} | {r.get('rate', '')} | "
                     f"{r.get('graph', '')} | {r.get('note', '').replace('|', '/')[:120]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
