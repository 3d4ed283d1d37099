"""``attn-dispatch probe``: check the capability data against what the backends do.

For each available backend and each small configuration of a grid (phase, KV
storage and layout, dtypes, head dims, page sizes, causal / window / soft cap /
sinks / LSE / scales), the probe compares what the data declares
(``router.backend_reasons``) with what happens on the live GPU:

* declared OK, runs and agrees with an fp64 computation      -> ``ok``
* declared OK, refused at plan time (BackendRejected)          -> ``PLAN-REFUSAL``
  (handled by fallback, but the data should have said so)
* declared OK, raises after planning or disagrees              -> ``OVER-PROMISE``
* declared not OK, but runs and agrees                         -> ``under-promise``
* declared not OK, and refuses or disagrees                    -> ``rejected``

Agreement bands (relative Frobenius error vs fp64): fp32 1e-5, fp16/bf16 1e-2,
fp8 KV 6e-2 (dispatch/benchmark/oracle.py: the one fp64 oracle, which this module re-exports as
``oracle``); the random batch builder is dispatch/inputs.py's.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from .oracle import band as _band
from .oracle import reference_of_batch, relative_error
from ..inputs import Case, make_batch
from ..problem import AttentionProblem

__all__ = ["BASE", "Case", "make_batch", "oracle", "rel_error", "band", "grid", "run_probe", "main"]

# ------------------------------------------------------------------- the batch
# Case and make_batch live in dispatch/inputs.py (autotune builds its inputs there too)
# ------------------------------------------------------------------ the oracle
# The one fp64 oracle (dispatch/benchmark/oracle.py) of the whole batch: (total_q, Hq, Dvo) output and
# (total_q, Hq) base-2 LSE; its relative error and agreement bands.
oracle = reference_of_batch
rel_error = relative_error


def band(problem: AttentionProblem) -> float:
    return _band(problem.q_dtype, problem.kv_dtype)


# -------------------------------------------------------------------- the grid
BASE = AttentionProblem(
    entry="probe", phase="prefill", kv_storage="paged", kv_layout="NHD", num_qo_heads=8, num_kv_heads=2,
    head_dim_qk=128, head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16",
    page_size=16, causal=True, return_lse=True)
PREFILL_LENS = ((7, 33, 2), (47, 33, 72))
DECODE_LENS = ((1, 1, 1, 1), (47, 129, 5, 300))
SPEC_LENS = ((3, 3, 3), (40, 9, 130))


def _vary(name: str, lens=PREFILL_LENS, **changes) -> Case:
    return Case(name, replace(BASE, **changes), *lens)


def grid() -> list[Case]:
    """One-factor-at-a-time variations around a paged bf16 causal GQA prefill, plus decode/spec-decode."""
    d = dict(phase="decode")
    cases = [
        _vary("prefill_paged"), _vary("prefill_paged_hnd", kv_layout="HND"),
        _vary("prefill_ragged", kv_storage="ragged", page_size=0),
        _vary("prefill_dense", kv_storage="dense", page_size=0, lens=((16, 16), (16, 16))),
        _vary("prefill_noncausal", causal=False), _vary("prefill_fp16", q_dtype="float16", kv_dtype="float16", out_dtype="float16"),
        _vary("prefill_no_lse", return_lse=False), _vary("prefill_mha", num_kv_heads=8), _vary("prefill_mqa", num_kv_heads=1),
        _vary("prefill_d64", head_dim_qk=64, head_dim_vo=64), _vary("prefill_d256", head_dim_qk=256, head_dim_vo=256),
        _vary("prefill_d192_128", head_dim_qk=192), _vary("prefill_d72", head_dim_qk=72, head_dim_vo=72),
        _vary("prefill_page1", page_size=1), _vary("prefill_page8", page_size=8), _vary("prefill_page64", page_size=64),
        _vary("prefill_page256", page_size=256), _vary("prefill_page12", page_size=12),
        _vary("prefill_window8", window_left=8), _vary("prefill_window8_noncausal", window_left=8, causal=False),
        _vary("prefill_softcap1", logits_soft_cap=1.0), _vary("prefill_sinks", has_sinks=True),
        _vary("prefill_ragged_window8", kv_storage="ragged", page_size=0, window_left=8),
        _vary("prefill_fp8kv", kv_dtype="float8_e4m3fn"),
        _vary("decode_paged", DECODE_LENS, **d), _vary("decode_paged_hnd", DECODE_LENS, kv_layout="HND", **d),
        _vary("decode_ragged", DECODE_LENS, kv_storage="ragged", page_size=0, **d),
        _vary("decode_window8", DECODE_LENS, window_left=8, **d), _vary("decode_sinks", DECODE_LENS, has_sinks=True, **d),
        _vary("decode_softcap1", DECODE_LENS, logits_soft_cap=1.0, **d),
        _vary("decode_no_lse", DECODE_LENS, return_lse=False, **d),
        _vary("decode_fp8kv", DECODE_LENS, kv_dtype="float8_e4m3fn", **d),
        _vary("spec_decode_paged", SPEC_LENS, phase="spec_decode", q_len_per_req=3),
    ]
    cases.append(replace(_vary("prefill_scales_tensor"), name="prefill_scales_tensor", out_scale=0.5, tensor_scales=True))
    cases.append(replace(_vary("prefill_ragged_out_scale", kv_storage="ragged", page_size=0), out_scale=0.5))
    return cases


# ------------------------------------------------------------------ one probe
@dataclass
class Outcome:
    backend: str
    case: str
    declared: bool
    reasons: list = field(default_factory=list)
    verdict: str = ""
    err_out: Optional[float] = None
    err_lse: Optional[float] = None
    error: str = ""
    seconds: float = 0.0


def _attempt(backend, case: Case, device) -> tuple:
    """Plan + run + compare. Returns (status, err_out, err_lse, message)."""
    from backends import BackendRejected

    batch = make_batch(case, device, seed=zlib.crc32(case.name.encode()))
    try:
        plan = backend.plan(case.problem, batch)
    except BackendRejected as exc:
        return "refused", None, None, str(exc)
    try:
        backend.run(plan, batch)
        torch.cuda.synchronize() if batch.q.is_cuda else None
    except Exception as exc:  # noqa: BLE001 - any failure after planning is a finding
        return "error", None, None, f"{type(exc).__name__}: {str(exc)[:300]}"
    ref_out, ref_lse = oracle(case.problem, batch)
    err_out = rel_error(batch.out, ref_out)
    err_lse = rel_error(batch.lse, ref_lse) if batch.lse is not None else None
    tol = band(case.problem)
    agrees = err_out <= tol and (err_lse is None or err_lse <= tol)
    note = "" if agrees else _disagreement(batch, ref_lse)
    return ("agrees" if agrees else "disagrees"), err_out, err_lse, note


def _disagreement(batch, ref_lse) -> str:
    if batch.lse is None:
        return "out disagrees"
    nan = int(torch.isnan(batch.lse).sum())
    mismatch = int((torch.isfinite(batch.lse) != torch.isfinite(ref_lse)).sum())
    return f"lse: {nan} NaN, {mismatch} finite/infinite mismatches of {batch.lse.numel()}"


VERDICTS = {
    (True, "agrees"): "ok", (True, "refused"): "PLAN-REFUSAL", (True, "error"): "OVER-PROMISE",
    (True, "disagrees"): "OVER-PROMISE", (False, "agrees"): "under-promise", (False, "refused"): "rejected",
    (False, "error"): "rejected", (False, "disagrees"): "rejected",
}
UNTRIED_FACTS = ("device_kind", "sm")  # never launch a kernel on a device the data excludes


def probe_one(name: str, case: Case, device_desc, device, try_rejected: bool) -> Outcome:
    from backends import get_backend

    from ..router import backend_reasons

    reasons = backend_reasons(name, case.problem, device_desc, live=False)
    result = Outcome(name, case.name, declared=not reasons, reasons=[str(r) for r in reasons])
    if reasons and (not try_rejected or any(r.field in UNTRIED_FACTS for r in reasons)):
        result.verdict = "rejected (not tried)"
        return result
    start = time.perf_counter()
    status, result.err_out, result.err_lse, result.error = _attempt(get_backend(name), case, device)
    result.seconds = time.perf_counter() - start
    result.verdict = VERDICTS[(result.declared, status)]
    return result


def context_poisoned() -> bool:
    """True when the CUDA context no longer works (an asynchronous fault happened)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return False
    except Exception:  # noqa: BLE001
        return True


# ------------------------------------------------------------------ the report
def run_probe(backends: list[str], cases: list[Case], try_rejected: bool = True, log=print) -> list[Outcome]:
    from ..devices import live_device
    from ..router import backend_reasons

    device = torch.device("cuda")
    desc = live_device(torch.empty(0, device=device))
    results = []
    for name in backends:
        for case in cases:
            case = as_ragged_if_paged_only_reason(name, case, desc, backend_reasons)
            outcome = probe_one(name, case, desc, device, try_rejected)
            results.append(outcome)
            if outcome.verdict not in ("ok", "rejected", "rejected (not tried)"):
                log(textwrap.fill(f"  {outcome.verdict:13s} {name:12s} {case.name:26s} {outcome.error or _errs(outcome)}",
                                  100, subsequent_indent=" " * 16))
            if outcome.error and context_poisoned():
                log(f"  CUDA context poisoned after {name}/{case.name}: stopping the probe")
                return results
    return results


def as_ragged_if_paged_only_reason(name: str, case: Case, desc, backend_reasons) -> Case:
    """A backend that rejects paged KV still gets the case's other features probed, on ragged KV."""
    if case.problem.kv_storage != "paged":
        return case
    fields = {r.field for r in backend_reasons(name, case.problem, desc, live=False)}
    if "kv_storage" not in fields:
        return case
    ragged = replace(case.problem, kv_storage="ragged", page_size=0, kv_layout="NHD")
    return replace(case, name=case.name + "@ragged", problem=ragged)


def _errs(o: Outcome) -> str:
    parts = [f"out {o.err_out:.2e}" if o.err_out is not None else "", f"lse {o.err_lse:.2e}" if o.err_lse is not None else ""]
    return ", ".join(p for p in parts if p) + ("; data: " + "; ".join(o.reasons) if o.reasons else "")


def environment() -> dict:
    from backends import REGISTRY, get_backend

    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for name in REGISTRY:  # every backend's version, from the data-driven registry
        try:
            env[name] = get_backend(name).version()
        except Exception as exc:  # noqa: BLE001 - an adapter that cannot answer is reported, not fatal
            env[name] = f"unknown ({type(exc).__name__})"
    return env


def summary(results: list[Outcome]) -> dict:
    counts: dict = {}
    for o in results:
        counts.setdefault(o.backend, {}).setdefault(o.verdict, 0)
        counts[o.backend][o.verdict] += 1
    return counts


def markdown(results: list[Outcome], env: dict) -> str:
    lines = ["# attn-dispatch probe report", "", *(f"- {k}: {v}" for k, v in env.items()), "",
             "| backend | case | declared | verdict | rel err out | rel err lse | note |", "|---|---|---|---|---|---|---|"]
    for o in results:
        fmt = lambda x: "" if x is None else f"{x:.2e}"  # noqa: E731
        note = (o.error or "; ".join(o.reasons)).replace("|", "/")[:160]
        lines.append(f"| {o.backend} | {o.case} | {'yes' if o.declared else 'no'} | {o.verdict} | "
                     f"{fmt(o.err_out)} | {fmt(o.err_lse)} | {note} |")
    lines += ["", "## Summary", "", "```", json.dumps(summary(results), indent=1), "```"]
    return "\n".join(lines) + "\n"


def write_report(results: list[Outcome], out_dir: Path, stem: str = "probe") -> tuple[Path, Path]:
    env = environment()
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    payload = {"environment": env, "summary": summary(results), "results": [o.__dict__ for o in results]}
    jpath.write_text(json.dumps(payload, indent=1, default=str))
    mpath.write_text(markdown(results, env))
    return jpath, mpath


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attn-dispatch probe", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("--backends", default="", help="comma-separated backend names (default: every available one)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: the whole grid)")
    parser.add_argument("--out-dir", default=".", help="where probe.json and probe.md are written")
    parser.add_argument("--no-try-rejected", action="store_true", help="do not run configurations the data rejects")
    parser.add_argument("--list", action="store_true", help="list the grid's cases and exit")
    parser.add_argument("--json", action="store_true", help="print JSON only (the summary and report paths)")
    return parser


def _selected_backends(text: str) -> list[str]:
    from backends import REGISTRY, get_backend
    from capability_db import backend_aliases

    names = [backend_aliases().get(n, n) for n in text.split(",") if n] or list(REGISTRY)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"--backends {','.join(unknown)!r}: unknown; valid options are: {', '.join(REGISTRY)}")
    return [n for n in names if get_backend(n).available() is None]


def _say(args: argparse.Namespace, text: str, **data) -> None:
    """Progress for people; under --json, stdout carries one JSON document and nothing else."""
    if args.json:
        print(json.dumps({"message": text, **data}, indent=1, default=str))
    else:
        print(text, file=sys.stderr if data.get("error") else sys.stdout)


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    cases = grid()
    if args.list:
        if args.json:
            print(json.dumps([{"case": c.name, "problem": c.problem.describe()} for c in cases], indent=1))
        else:  # wrapped to the terminal's 100 columns
            print("\n".join(textwrap.fill(f"{c.name:28s} {c.problem.describe()}", 100, subsequent_indent=" " * 29)
                            for c in cases))
        return 0
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.name in wanted]
    if not torch.cuda.is_available():  # 1, not 2: the options were fine, the machine lacks what they need
        _say(args, "attn-dispatch probe: probe needs a CUDA GPU; this machine has none (--list shows the cases)",
             error="no CUDA device", summary={})
        return 1
    try:
        backends = _selected_backends(args.backends)
    except ValueError as exc:  # names the option, the value and the valid options
        _parser().error(str(exc))
    if not args.json:
        print(f"probing {', '.join(backends) or 'no available backend'} over {len(cases)} cases")
    results = run_probe(backends, cases, try_rejected=not args.no_try_rejected)
    jpath, mpath = write_report(results, Path(args.out_dir))
    counts = summary(results)
    over = sum(1 for o in results if o.verdict == "OVER-PROMISE")
    if args.json:
        print(json.dumps({"backends": backends, "cases": len(cases), "summary": counts,
                          "over_promises": over, "report": [str(jpath), str(mpath)]}, indent=1))
    else:
        print("\n".join(textwrap.fill(f"{b:12s} {c}", 100, subsequent_indent=" " * 13) for b, c in counts.items()))
        print(f"report: {jpath} {mpath}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
