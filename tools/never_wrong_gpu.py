"""Never wrong on a GPU: extreme negative logits and fp8 KV, every backend forced, against fp64.

Extreme logits (FlashInfer's ``test_single_prefill_extreme_negative_logits``, run through every
entry point): every raw logit at L except key 0 of each request at L + 1024; the answer is v[0].
A backend that masks with a finite sentinel (FlashInfer before PR #4401) returns zeros.
``masked``: the same with key 0 masked out (a custom mask): key 0 must not leak.

fp8 KV: paged decode with an e4m3 cache and bf16 queries, k_scale / v_scale 1 and (0.5, 2.0),
against fp64 over the dequantized cache.

    python -m tools.never_wrong_gpu --out DIR     # writes DIR/never-wrong-<gpu>.json and .md
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
from pathlib import Path

import torch

import dispatch
from dispatch.benchmark import cases
from dispatch.benchmark.oracle import attention_fp64, relative_error

BACKENDS = ("fa2", "fa3", "cudnn", "xqa", "trtllm-gen", "torch-flash", "native-triton", "reference")
LOGITS = (-1e4, -5e4, -5.5e4, -6e4, -1e5, -2e5, -2.45e5)
HQ, HKV, D = 16, 16, 128
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _forced(name, call):
    """(output, None) or (None, why) for ``call`` under ``dispatch.use_backend(name)``."""
    try:
        with dispatch.use_backend(name):
            return call(), None
    except Exception as e:  # a refusal is a result here, not a crash
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:140]}"


def _extreme_single(logit, dtype, masked):
    """Single prefill, 64 keys: q all ones, k constant per key so that q.k * sm_scale = logit."""
    kv, sm = 64, 1.0 / math.sqrt(D)
    q = torch.ones(1, HQ, D, dtype=dtype, device=DEV)
    k = torch.full((kv, HKV, D), logit / (sm * D), dtype=dtype, device=DEV)
    k[0] = (logit + 1024) / (sm * D)
    v = torch.randn(kv, HKV, D, dtype=dtype, device=DEV)
    mask = None
    if masked:
        mask = torch.ones(1, kv, dtype=torch.bool, device=DEV)
        mask[0, 0] = False
    ref, _ = attention_fp64(q, k, v, sm_scale=sm, mask=mask)

    def call():
        return dispatch.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, sm_scale=sm)
    return call, ref


def _extreme_paged(logit, dtype, entry):
    """A paged case (3 requests, pages of 16) with the same logits; key 0 of each request high."""
    c = cases.paged((1, 1, 1), (64, 33, 100), "NHD", dtype, 0, DEV, num_qo_heads=HQ, num_kv_heads=HKV,
                    head_dim=D, page_size=16)
    sm = 1.0 / math.sqrt(D)
    c["q"].fill_(1.0)
    c["cache"][:, 0].fill_(logit / (sm * D))
    starts = c["kv_indptr"][:-1].tolist()
    for page in c["perm"][starts].tolist():
        c["cache"][page, 0, 0] = (logit + 1024) / (sm * D)
    refs = []
    for b, kv_len in enumerate(c["kv_lens"]):
        pages = c["perm"][c["kv_indptr"][b]:c["kv_indptr"][b + 1]]
        k = c["cache"][pages, 0].reshape(-1, HKV, D)[:kv_len]
        v = c["cache"][pages, 1].reshape(-1, HKV, D)[:kv_len]
        refs.append(attention_fp64(c["q"][b:b + 1], k, v, sm_scale=sm, causal=True)[0])
    ref = torch.cat(refs)
    if entry == "paged":  # planned under the forced backend: a wrapper's plan fixes its backend
        return (lambda: cases.paged_wrapper(c).run(c["q"], c["cache"])), ref
    if entry == "xqa":
        args, kw = cases.xqa_args(c)
        return (lambda: dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)), ref
    if entry == "cudnn":
        args, kw = cases.cudnn_args(c)
        return (lambda: dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)[0]), ref
    args, kw = cases.trtllm_args(c)
    return (lambda: dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)), ref


def extreme_rows():
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for logit in LOGITS:
            builds = {"single": lambda: _extreme_single(logit, dtype, False),
                      "single-masked": lambda: _extreme_single(logit, dtype, True)}
            for entry in ("paged", "xqa", "cudnn", "trtllm"):
                builds[entry] = (lambda e=entry: _extreme_paged(logit, dtype, e))
            for entry, build in builds.items():
                call, ref = build()
                for name in BACKENDS:
                    out, why = _forced(name, call)
                    err = None if out is None else relative_error(out, ref)
                    rows.append(dict(test="extreme", entry=entry, dtype=str(dtype)[6:], logit=logit, backend=name,
                                     error=err, zeros=None if out is None else bool(out.abs().max() == 0),
                                     refused=why))
    return rows


def fp8_rows():
    rows = []
    for batch, kv_len in ((64, 4096), (8, 16384)):
        c = cases.paged((1,) * batch, (kv_len,) * batch, "NHD", torch.bfloat16, 1, DEV, num_qo_heads=32,
                        num_kv_heads=8, head_dim=128, page_size=16)
        cache8 = c["cache"].to(torch.float8_e4m3fn)
        sm = 1.0 / math.sqrt(128)
        for ks, vs in ((1.0, 1.0), (0.5, 2.0)):
            deq = cache8.double()
            refs = []
            for b in range(batch):
                pages = c["perm"][c["kv_indptr"][b]:c["kv_indptr"][b + 1]]
                k = deq[pages, 0].reshape(-1, 8, 128)[:kv_len] * ks
                v = deq[pages, 1].reshape(-1, 8, 128)[:kv_len] * vs
                refs.append(attention_fp64(c["q"][b:b + 1], k, v, sm_scale=sm)[0])
            ref = torch.cat(refs)
            q1 = c["q"][:batch].contiguous()
            ws = cases.ws(DEV)

            def xqa_call():
                return dispatch.xqa_batch_decode_with_kv_cache(q1, cache8, ws, c["table"], c["seq"], kv_len,
                                                               sm * ks, vs)
            c8 = dict(c, cache=cache8)

            def paged_call():  # planned under the forced backend
                return cases.paged_wrapper(c8, causal=False).run(q1, cache8, k_scale=ks, v_scale=vs)
            for entry, call in (("xqa", xqa_call), ("paged", paged_call)):
                for name in BACKENDS:
                    out, why = _forced(name, call)
                    rows.append(dict(test="fp8", entry=entry, batch=batch, kv=kv_len, k_scale=ks, v_scale=vs,
                                     backend=name, error=None if out is None else relative_error(out, ref),
                                     refused=why))
    return rows


def versions():
    out = dict(gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", torch=torch.__version__, python=platform.python_version(),
               date=datetime.date.today().isoformat())
    for mod in ("flashinfer", "cudnn", "triton"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:
            out[mod] = f"absent ({type(e).__name__})"
    return out


def markdown(meta, rows):
    lines = [f"# never wrong on {meta['gpu']}", "", "versions: " + ", ".join(f"{k} {v}" for k, v in meta.items()), "",
             "Extreme logits: relative error against fp64 (band 1e-2); ZEROS = an all-zero output.", "",
             "| entry | dtype | logit | " + " | ".join(BACKENDS) + " |", "|---|---|---|" + "---|" * len(BACKENDS)]
    ext = [r for r in rows if r["test"] == "extreme"]
    keys = sorted({(r["entry"], r["dtype"], r["logit"]) for r in ext}, key=lambda t: (t[0], t[1], -t[2]))
    for key in keys:
        cells = []
        for name in BACKENDS:
            r = next(r for r in ext if (r["entry"], r["dtype"], r["logit"], r["backend"]) == key + (name,))
            cells.append("-" if r["error"] is None else ("ZEROS" if r["zeros"] else f"{r['error']:.1e}"))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | " + " | ".join(cells) + " |")
    lines += ["", "fp8 e4m3 KV, bf16 q, 32/8 heads, d128: relative error against fp64 over the dequantized cache "
              "(band 6e-2).", "", "| entry | batch x kv | k_scale, v_scale | " + " | ".join(BACKENDS) + " |",
              "|---|---|---|" + "---|" * len(BACKENDS)]
    f8 = [r for r in rows if r["test"] == "fp8"]
    if not f8:
        lines.append("(not run)")
    for key in sorted({(r["entry"], r["batch"], r["kv"], r["k_scale"], r["v_scale"]) for r in f8}):
        cells = []
        for name in BACKENDS:
            r = next(r for r in f8 if (r["entry"], r["batch"], r["kv"], r["k_scale"], r["v_scale"], r["backend"])
                     == key + (name,))
            cells.append("-" if r["error"] is None else f"{r['error']:.2e}")
        lines.append(f"| {key[0]} | {key[1]} x {key[2]} | {key[3]}, {key[4]} | " + " | ".join(cells) + " |")
    lines += ["", "`-`: the backend refused or is absent (the JSON has each reason)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-fp8", action="store_true", help="the extreme-logit rows only")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    meta = versions()
    rows = extreme_rows() + ([] if a.no_fp8 else fp8_rows())
    name = f"never-wrong-h200{a.tag}"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{name}.json").write_text(json.dumps(dict(meta=meta, seed=0, rows=rows), indent=1))
    md = markdown(meta, rows)
    (a.out / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
