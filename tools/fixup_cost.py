"""What xqa's fix-up costs (backends/xqa.py: native-triton's FIXUP launch after each XQA decode), on a GPU.

Per problem of a bench problem file, the CUDA-graph ms per call (10 calls in one graph, the one timing
helper) of: XQA alone (the adapter with its guard switched off), XQA + the fix-up as planned, XQA + the
fix-up on other tiles (VARIANTS of triton_backend.FIXUP_TILE), the fix-up alone, and XQA
+ an empty Triton kernel (what any second launch after XQA costs). Writes DIR/fixup-cost-<stem>.json/.md.

    python -m tools.fixup_cost tools/grids/xqa-fixup-cost.json --out DIR
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from unittest import mock

import torch

from backends import xqa
from backends.native import triton_backend as tb
from dispatch import policy, router, timing
from dispatch.entries import _base
from dispatch.benchmark import problems
from dispatch.benchmark.build import build

VARIANTS = {"stages3_n128": dict(num_stages=3, block_n=128), "stages1_n16_w2": dict(num_stages=1, block_n=16, num_warps=2),
            "stages1_n16_w1": dict(num_stages=1, block_n=16, num_warps=1)}
REPS, CALLS = 20, 10


def _graph_ms(fn) -> float:
    fn()
    return timing.graph_ms([fn] * CALLS, REPS)[0]


def _forget() -> None:
    _base.clear_caches()
    router.clear_caches()


def _ours(built) -> float:
    """XQA forced through the public call, as planned now (the fix-up included unless patched)."""
    _forget()
    with policy.use_backend("xqa"):  # a wrapper is planned in built.call()
        call, op = built.call(), built.operands[0]
        return _graph_ms(lambda: call(op))


def _empty_kernel():
    import triton

    @triton.jit
    def _nothing(x):
        pass

    return lambda: _nothing[(1,)](0)


def measure(built) -> dict:
    row = {"name": built.problem.name}
    with mock.patch.object(xqa.XqaBackend, "guarded", lambda self, d, p: False):
        row["xqa_alone"] = _ours(built)
        _forget()
        with policy.use_backend("xqa"):
            call, op, empty = built.call(), built.operands[0], _empty_kernel()
            row["xqa_then_empty_kernel"] = _graph_ms(lambda: (call(op), empty()))
    for name, change in VARIANTS.items():
        with mock.patch.object(tb, "FIXUP_TILE", change):
            row[f"fixup_{name}"] = _ours(built)
    seen = {}
    planned = xqa.XqaBackend.plan

    def spy(self, problem, batch):  # the plan and batch of the call: the fix-up's own launch
        seen["plan"], seen["batch"] = planned(self, problem, batch), batch
        return seen["plan"]

    with mock.patch.object(xqa.XqaBackend, "plan", spy):
        row["fixup_planned"] = _ours(built)
    fixup = seen["plan"].fixup
    row["fixup_alone"] = _graph_ms(lambda: xqa._NATIVE.run(fixup, seen["batch"])) if fixup else None
    return {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in row.items()}  # us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    items = [problems.problem_from_json(x) for x in json.loads(args.problems.read_text())]
    rows = []
    for i, p in enumerate(items):
        built = build(p, "cuda", seed=i)
        try:
            rows.append(measure(built))
        except Exception as exc:  # noqa: BLE001 - one problem failing is a row, not the end
            rows.append({"name": p.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
        print(rows[-1], flush=True)
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    stem = f"fixup-cost-{args.problems.stem}"
    (args.out / f"{stem}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    cols = ["xqa_alone", "fixup_planned", *(f"fixup_{n}" for n in VARIANTS), "xqa_then_empty_kernel", "fixup_alone"]
    lines = [f"# xqa's fix-up: CUDA-graph us per call ({env['gpu']}, torch {env['torch']}, {env['date']})", "",
             "| problem | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += ["| " + r["name"] + " | " + " | ".join(str(r.get(c, r.get("error", ""))) for c in cols) + " |" for r in rows]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
