"""The xqa trace's GPU times against the choice table: does a kernel's time follow the batch's longest
request or its mean? (no GPU needed; reads committed trace rows)

    python -m tools.trace_vs_table docs/data/trace-h200-seed-*.json.gz

The table was fitted on batches whose requests all have the longest length; an engine's decode batch
has lengths spread below it. For each timed xqa step of a trace run, the steps are drawn again from the
run's seed (the trace is deterministic), and each side's measured GPU ms per call (ours: the backend auto
chose; FlashInfer's: its XQA kernel) is divided by the table's expected ms for that backend read at the
batch's longest length and at its mean length. A ratio near 1 says which one the kernel's time follows.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from dataclasses import replace

import capability_db
from capability_db import choice_table
from dispatch.benchmark import trace
from dispatch.problem import AttentionProblem


def xqa_problem(cfg: dict) -> AttentionProblem:
    dtype = cfg["dtype"]
    return AttentionProblem(entry="xqa_batch_decode_with_kv_cache", phase="decode", kv_storage="paged",
                            kv_layout="NHD", num_qo_heads=cfg["hq"], num_kv_heads=cfg["hkv"],
                            head_dim_qk=cfg["head_dim"], head_dim_vo=cfg["head_dim"], q_dtype=dtype, kv_dtype=dtype,
                            out_dtype=dtype, device_type="cuda", page_size=cfg["page"])


def run_ratios(path: str, gpu: str) -> dict:
    """Median measured / expected per side, at the longest and at the mean length, for one run."""
    run = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    entry, cfg = run["entries"]["xqa"], run["config"]
    table = choice_table.table_for(capability_db.resolve_device(gpu))
    problem = xqa_problem(cfg)
    parser = trace.parser()
    config = replace(trace.config(parser, parser.parse_args(["--device", "cpu"])),
                     bounds=trace.Bounds(**cfg["bounds"]), page=cfg["page"], steps=cfg["steps"])
    steps = trace.draw("decode", run["seed"], "timed", cfg["steps"], config)
    if [s.describe() for s in steps] != entry["per_step"]:
        raise ValueError(f"{path}: the steps drawn again from seed {run['seed']} are not the run's")
    ours_name = max(entry["ours"]["served_by"], key=entry["ours"]["served_by"].get)
    ratios: dict = {}
    for step, ours, theirs in zip(steps, entry["ours"]["per_step_gpu_ms"], entry["flashinfer"]["per_step_gpu_ms"]):
        b = len(step.requests)
        for at, kv in (("longest", max(step.kv_lens)), ("mean", sum(step.kv_lens) / b)):
            expected, _ = table.gpu_ms(problem, (b, 1, kv), of_class=False)
            for side, name, ms in (("ours", ours_name, ours), ("flashinfer", "xqa", theirs)):
                ratios.setdefault((side, name, at), []).append(ms / cfg["layers"] / expected[name])
        ratios.setdefault(("measured", "ours / flashinfer", ""), []).append(ours / theirs)
    return {run["seed"]: {" ".join(filter(None, key)): round(statistics.median(v), 3) for key, v in ratios.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="trace JSON files (.json or .json.gz) with an xqa entry")
    parser.add_argument("--gpu", default="h200", help="the table to read (default h200)")
    args = parser.parse_args(argv)
    for path in args.runs:
        print(json.dumps(run_ratios(path, args.gpu)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
