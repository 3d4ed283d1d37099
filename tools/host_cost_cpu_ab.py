"""Host cost of an exact repeat on the CPU, two or more source trees side by side (A/B).

    python -m tools.host_cost_cpu_ab base=/tmp/wt-base branch=. [--rounds 3]

Each tree runs in its own subprocess (PYTHONPATH = the tree), the trees alternated ``--rounds``
times; the table holds each entry's median over the rounds, in microseconds per call. A round
times the lane path a GPU serving loop takes: CPU tensors with ``_base.CPU_VALUE_CHECKS = False``,
the reference backend's launcher a no-op (no kernel), min over 40 x 300 calls. The functions take
``tools.lab.host_cost``'s CPU calls (xqa with a (k, v) pair); the wrappers run a batch of
(3, 1, 5) queries over (9, 4, 13) KV rows (pages of 4 for the paged one). Measurement code: never
imported by dispatch/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit

ENTRIES = ("xqa_batch_decode_with_kv_cache", "trtllm_batch_context_with_kv_cache",
           "cudnn_batch_prefill_with_kv_cache", "single_prefill_with_kv_cache",
           "BatchPrefillWithPagedKVCacheWrapper.run", "BatchPrefillWithRaggedKVCacheWrapper.run")
Q_LENS, KV_LENS, PAGE = (3, 1, 5), (9, 4, 13), 4


def wrappers(dispatch, torch, s, x) -> dict:
    """The two wrappers planned on the batch above (the page ids in a random order)."""
    def ints(values):
        return torch.tensor(values, dtype=torch.int32)
    pages = [-(-n // PAGE) for n in KV_LENS]
    qo, kv_rows, page_indptr = [0], [0], [0]
    for q, k, p in zip(Q_LENS, KV_LENS, pages):
        qo.append(qo[-1] + q)
        kv_rows.append(kv_rows[-1] + k)
        page_indptr.append(page_indptr[-1] + p)
    ids = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(1)).to(torch.int32)
    last = ints([(n - 1) % PAGE + 1 for n in KV_LENS])
    paged = dispatch.BatchPrefillWithPagedKVCacheWrapper(x["ws"], "NHD")
    paged.plan(ints(qo), ints(page_indptr), ids, last, s.hq, s.hkv, s.d, PAGE, q_data_type=s.dtype)
    ragged = dispatch.BatchPrefillWithRaggedKVCacheWrapper(x["ws"], "NHD")
    ragged.plan(ints(qo), ints(kv_rows), s.hq, s.hkv, s.d, q_data_type=s.dtype)
    q = torch.randn(qo[-1], s.hq, s.d, dtype=s.dtype)
    cache = torch.randn(sum(pages), 2, PAGE, s.hkv, s.d, dtype=s.dtype)
    k, v = (torch.randn(kv_rows[-1], s.hkv, s.d, dtype=s.dtype) for _ in range(2))
    return {ENTRIES[4]: lambda: paged.run(q, cache), ENTRIES[5]: lambda: ragged.run(q, k, v)}


def child() -> None:
    """One round in this tree: microseconds per call of every entry, as JSON on stdout."""
    import torch
    import dispatch
    from backends.native.reference import ReferenceBackend
    from dispatch import decode, prefill
    from dispatch.entries import _base
    from tools.lab import host_cost as hc

    _base.CPU_VALUE_CHECKS = False  # the GPU's cached path, driven on the CPU
    ReferenceBackend.launcher = lambda self, plan, batch: lambda b: None  # no kernel: host cost only
    s = hc.SHAPES["cpu"]
    x = hc.inputs(s, "cpu")
    calls = hc.entry_calls(hc.Api(prefill, decode), x, s, {"paged": None, "ragged": None})
    calls.update(wrappers(dispatch, torch, s, x))
    result = {}
    for name in ENTRIES:
        fn = calls[name]
        for _ in range(3):  # the checked call, the backend's plan, the launcher
            fn()
        result[name] = min(timeit.repeat(fn, number=300, repeat=40)) / 300 * 1e6
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="*", help="label=path of a source tree (a worktree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child()
    if not args.trees:
        parser.error("give at least one label=path")
    trees = [t.split("=", 1) for t in args.trees]
    runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
    for r in range(args.rounds):
        for label, path in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                                 cwd=path, check=True, capture_output=True, text=True).stdout
            runs[label].append(json.loads(out.splitlines()[-1]))
            print(f"round {r + 1} {label}: " + " ".join(f"{v:.2f}" for v in runs[label][-1].values()),
                  file=sys.stderr)
    print("| entry | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for name in ENTRIES:
        cells = [f"{statistics.median(run[name] for run in runs[label]):.2f}" for label, _ in trees]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
