"""GPU check of the cuDNN and torch-flash adapters, in one call on the device machine.

1. environment (GPU, torch, cuDNN, the aten flash op's schema);
2. the probe (agreement vs fp64 over the grid, declared vs actual) for cudnn + torch-flash;
3. CUDA-graph replay equals eager (cudnn paged decode, torch-flash ragged prefill);
4. benchmark on the anchor workloads (bf16, 32/8 heads, d128, pages of 16):
   decode 64 x 4096 keys (TB/s of KV read), causal prefill 8 x 2048 (TFLOP/s).

Writes gpu_cudnn.json / gpu_cudnn.md and probe.json / probe.md into $OUT (or argv[1]);
prints a short table last.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _gpu_common import time_ms as _time_ms  # noqa: E402  (tools/ is sys.path[0])
from backends import get_backend  # noqa: E402
from dispatch import probe  # noqa: E402
from dispatch.probe import Case, make_batch, oracle, rel_error  # noqa: E402

BACKENDS = ("cudnn", "torch-flash")


def environment() -> dict:
    env = probe.environment()
    env["flash_op_schema"] = str(torch.ops.aten._flash_attention_forward.default._schema)
    env["availability"] = {n: str(get_backend(n).available()) for n in BACKENDS}
    return env


def _fresh(batch, gen_seed: int) -> None:
    """New random q / k / v values in place (the captured graph reads the same buffers)."""
    g = torch.Generator(device=batch.q.device).manual_seed(gen_seed)
    for t in (batch.q, batch.k, batch.v):
        t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype))


def graph_replay(name: str, case: Case) -> dict:
    """Capture run() after a warm-up plan; replay on new inputs; compare with eager and fp64."""
    backend = get_backend(name)
    batch = make_batch(case, torch.device("cuda"), seed=1)
    plan = backend.plan(case.problem, batch)
    backend.run(plan, batch)  # warm-up (lazy init outside capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.run(plan, batch)
    _fresh(batch, 7)
    batch.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed = batch.out.clone()
    batch.out.fill_(float("nan"))
    backend.run(plan, batch)
    torch.cuda.synchronize()
    ref, _ = oracle(case.problem, batch)
    return {"backend": name, "case": case.name, "replay_vs_eager_max_abs": float((replayed.float() - batch.out.float()).abs().max()),
            "replay_vs_fp64_rel": rel_error(replayed, ref), "replay_has_nan": bool(torch.isnan(replayed).any())}




ANCHOR = probe.BASE.__class__(
    entry="bench", phase="decode", kv_storage="paged", kv_layout="NHD", num_qo_heads=32, num_kv_heads=8,
    head_dim_qk=128, head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16", page_size=16)


def _bench_cases() -> list[tuple[Case, str]]:
    decode = Case("decode_64x4096", ANCHOR, (1,) * 64, (4096,) * 64)
    prefill = Case("prefill_causal_8x2048", replace(ANCHOR, phase="prefill", causal=True), (2048,) * 8, (2048,) * 8)
    out = []
    for case in (decode, prefill):
        out.append((case, "cudnn"))
        ragged = replace(case, problem=replace(case.problem, kv_storage="ragged", page_size=0))
        out.append((replace(ragged, name=case.name), "torch-flash"))
        out.append((replace(ragged, name=case.name), "cudnn"))
    return out


def bench_one(case: Case, name: str) -> dict:
    backend = get_backend(name)
    batch = make_batch(case, torch.device("cuda"), seed=3)
    t0 = time.perf_counter()
    plan = backend.plan(case.problem, batch)
    first_plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        backend.plan(case.problem, batch)
    torch.cuda.synchronize()
    plan_us = (time.perf_counter() - t0) / 20 * 1e6
    ms = _time_ms(lambda: backend.run(plan, batch))
    p, row = case.problem, {"backend": name, "case": case.name, "kv": case.problem.kv_storage, "ms": ms,
                            "first_plan_s": first_plan_s, "cached_plan_us": plan_us}
    if p.phase == "decode":
        kv_bytes = sum(case.kv_lens) * p.num_kv_heads * (p.head_dim_qk + p.head_dim_vo) * 2
        row["TB/s"] = kv_bytes / (ms * 1e-3) / 1e12
    else:
        pairs = sum(q * (q + 1) / 2 for q in case.q_lens)
        row["TFLOP/s"] = 2 * pairs * p.num_qo_heads * (p.head_dim_qk + p.head_dim_vo) / (ms * 1e-3) / 1e12
    row["nan_in_out"] = bool(torch.isnan(batch.out).any())
    return row


def _safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - report, continue with the rest
        return {"args": [getattr(a, "name", a) for a in args], "error": f"{type(exc).__name__}: {str(exc)[:400]}"}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
    env = environment()
    print(json.dumps(env, indent=1))
    results = probe.run_probe(list(BACKENDS), probe.grid())
    probe.write_report(results, out_dir, stem="probe")
    replay_prob = replace(probe.BASE, phase="decode")
    replays = [_safe(graph_replay, "cudnn", Case("decode_paged", replay_prob, (1,) * 4, (47, 129, 5, 300))),
               _safe(graph_replay, "torch-flash", Case("prefill_ragged", replace(probe.BASE, kv_storage="ragged", page_size=0),
                                                       (7, 33, 2), (47, 33, 72)))]
    bench = [_safe(bench_one, c, n) for c, n in _bench_cases()]
    report = {"environment": env, "probe_summary": probe.summary(results), "cuda_graph_replay": replays, "benchmark": bench}
    (out_dir / "gpu_cudnn.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "gpu_cudnn.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


def _markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# cuDNN / torch-flash on {env.get('gpu')} ({env.get('date')})", "",
             f"torch {env['torch']} (CUDA {env['cuda']}); {env.get('cudnn')}", "", "## Probe summary", "",
             "```", json.dumps(report["probe_summary"]), "```", "", "## CUDA-graph replay", ""]
    lines += [f"- {json.dumps(r)}" for r in report["cuda_graph_replay"]]
    lines += ["", "## Benchmark (median of 30, CUDA events)", "", "| backend | case | KV | ms | TB/s | TFLOP/s | cached plan us |",
              "|---|---|---|---|---|---|---|"]
    for r in report["benchmark"]:
        if "error" in r:
            lines.append(f"| {r['args']} | error: {r['error'][:200]} | | | | | |")
            continue
        lines.append(f"| {r['backend']} | {r['case']} | {r['kv']} | {r['ms']:.3f} | {r.get('TB/s', 0):.2f} | "
                     f"{r.get('TFLOP/s', 0):.0f} | {r['cached_plan_us']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
