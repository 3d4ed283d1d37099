"""Air-gapped deployment: FlashInfer's attention modules for sm_90a (Hopper), built ahead on a machine
with nvcc and no GPU, so a GPU machine without network starts with them instead of compiling each the
first time a call needs it (about a minute per fa2/fa3 module; fa3's about 70 s on an H100).

Which modules: those the problems of the bench's engine-shaped random distribution need
(dispatch/benchmark/randomgrid.py, drawn ``--draws`` times): fa2's, fa3's and (decode) XQA's where the
backend takes the problem on an H100 (the router's capability reasons), named by FlashInfer's URI:
(dtypes, head dim, window on/off, soft cap on/off) for fa2's and fa3's batch or single-request module,
(dtypes, page size, head dim, group, window on/off) for XQA's. Built the most worth building first
(``plan``: share of problems x compile seconds saved on the GPU machine / seconds here), skipping those
``--out`` holds already, each into ``--out/<name>/<name>.so``, stripped; tools/offline/merge_kernels.sh
packs a selection of ``--out`` (``--carry-mb``) and tools/offline/activate.sh installs them as
FlashInfer's AOT modules. FlashInfer loads an AOT module it cannot use with a warning and compiles
instead (flashinfer/jit/core.py ``try_load``), so a module built wrong here costs what it cost before.

Set-up (once per machine; FlashInfer's tree is the pruned one of tools/offline/pack_wheels.sh):

    mkdir -p /tmp/fic/site && xz -dc .offline/flashinfer.tar.xz | tar x -C /tmp/fic/site
    python -m pip install -q --target /tmp/fic/site apache-tvm-ffi==0.1.15.post2 ninja requests numpy einops nvidia-ml-py
    mkdir -p /tmp/cudalib && ln -sf /usr/local/cuda-13.0/lib/libcudart.so /tmp/cudalib/
    echo 'void stub(void){}' | gcc -shared -x c - -o /tmp/cudalib/libcuda.so -Wl,-soname,libcuda.so.1
    python -m pip download --no-deps -d /tmp/fic/w nvidia-curand && unzip -q /tmp/fic/w/nvidia_curand-*.whl -d /tmp/fic/cur
    PYTHONPATH=/tmp/fic/site:$PWD PATH=/tmp/fic/site/bin:$PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic/ws \\
      FLASHINFER_CUDA_ARCH_LIST=9.0a LIBRARY_PATH=/tmp/cudalib \\
      CPATH=/tmp/fic/cur/nvidia/cu13/include:/usr/local/cuda-13.0/include \\
      python -m tools.offline.prebuild_kernels --minutes 90

(the libcuda stub only lets the link find ``-lcuda``: a module needs libcudart.so.13, and XQA's the
driver's libcuda.so.1, as the ones a GPU machine builds do; fa3's sources include cutlass's
curand_kernel.h, which a CUDA toolkit without cuRAND lacks and the nvidia-curand wheel holds; XQA's host
file includes cuda.h, which FlashInfer, finding nvcc in /usr/local/bin, looks for in /usr/local/include).
``--plan`` prints the order and each module's share of problems, building nothing.
"""
from __future__ import annotations

import argparse
import collections
import lzma
import math
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import capability_db
from dispatch import router
from dispatch.benchmark.problems import SINGLE, SINGLE_LSE, BenchProblem, problem_of
from dispatch.benchmark.randomgrid import draw_one

H100 = capability_db.device_for_capability(9, 0, "NVIDIA H100 80GB HBM3")
SHORT = {"bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "e4m3"}


@dataclass(frozen=True)
class Module:
    kind: str  # "batch", "single" or "xqa"
    backend: str
    q: str  # dtype names
    kv: str
    head_dim: int
    window: bool
    cap: bool = False
    page: int = 0  # XQA's alone
    group: int = 0


def needed(p: BenchProblem) -> list[Module]:
    """The FlashInfer modules a call of ``p`` makes FlashInfer build: fa2's and fa3's batch (or single-request)
    module and XQA's decode module, for each of them that takes the problem on an H100 (the router's
    capability reasons, as the forced runs meet them)."""
    problem = problem_of(p)
    takes = [n for n in ("fa2", "fa3", "xqa") if not router.backend_reasons(n, problem, H100, live=False)]
    kind = "single" if p.entry in (SINGLE, SINGLE_LSE) else "batch"
    kv = p.kv_type if p.kv_type.startswith("float8") else p.dtype
    mods = [Module(kind, n, p.dtype, kv, p.head_dim, p.window_left >= 0, p.soft_cap > 0) for n in takes if n != "xqa"]
    if "xqa" in takes and p.q_len == 1:
        mods.append(Module("xqa", "xqa", p.dtype, kv, p.head_dim, p.window_left >= 0, page=p.page_size,
                           group=p.num_qo_heads // p.num_kv_heads))
    return mods


def name(m: Module) -> str:
    q, kv = SHORT[m.q], SHORT[m.kv]
    if m.kind == "xqa":
        return (f"xqa_input_{q}_kv_cache_{kv}_output_{q}_page_size_{m.page}_head_dim_{m.head_dim}_head_group_ratio_"
                f"{m.group}_use_sliding_window_{m.window}_use_spec_dec_False_spec_q_seq_len_1")
    idx = "_dtype_idx_i32" if m.kind == "batch" else ""
    base = (f"{m.kind}_prefill_with_kv_cache_dtype_q_{q}_dtype_kv_{kv}_dtype_o_{q}{idx}_head_dim_qk_{m.head_dim}"
            f"_head_dim_vo_{m.head_dim}_posenc_0_use_swa_{m.window}_use_logits_cap_{m.cap}_f16qk_False")
    return base + ("_sm90" if m.backend == "fa3" else "_kv_stride_equal" if m.kind == "batch" else "")


# Seconds one module takes to compile: on an H100 (fa3 about 70 s, XQA 10-15 s; fa2 taken as 30) and
# here on two CPU cores (fa2's batch module 15-64 s, its single-request one 24-44, fa3's 271-316 and
# 160-165; XQA taken as 60). A module is worth building here by the GPU machine's seconds it saves per
# second it takes here.
DEVICE_S = {"fa2": 30.0, "fa3": 70.0, "xqa": 12.0}
HERE_S = {("batch", "fa2"): 45.0, ("single", "fa2"): 30.0, ("batch", "fa3"): 270.0, ("single", "fa3"): 160.0,
          ("xqa", "xqa"): 60.0}


def plan(draws: int, seed: int) -> list[tuple[Module, float]]:
    """The modules the distribution needs, with the share of problems needing each, in the order
    worth building: share x GPU-machine seconds saved / seconds here."""
    rng, counts = random.Random(seed), collections.Counter()
    for _ in range(draws):
        counts.update(set(needed(draw_one(rng, "cuda"))))
    def worth(m: Module) -> float:
        return counts[m] * DEVICE_S[m.backend] / HERE_S[(m.kind, m.backend)]
    return [(m, counts[m] / draws) for m in sorted(counts, key=worth, reverse=True)]


def spec(m: Module):
    """FlashInfer's build spec of the module (its URI must equal ``name(m)``)."""
    import torch
    from flashinfer.jit.attention import modules
    from flashinfer.jit.xqa import gen_xqa_module
    tq, tkv, d = getattr(torch, m.q), getattr(torch, m.kv), m.head_dim
    if m.kind == "xqa":
        return gen_xqa_module(tq, tkv, m.page, d, m.group, m.window, tq, 1, False)
    if m.kind == "single":
        return modules.gen_single_prefill_module(m.backend, tq, tkv, tq, d, d, 0, m.window, m.cap, False)
    if m.backend == "fa3":
        return modules.gen_batch_prefill_module(m.backend, tq, tkv, tq, torch.int32, d, d, 0, m.window, m.cap, False)
    return modules._gen_batch_prefill_module(m.backend, tq, tkv, tq, torch.int32, d, d, 0, m.window, m.cap, False,
                                             paged_kv_stride_mode="equal", module_surface="full")


def build(m: Module, out: Path) -> float:
    """Build the module and copy its library, stripped, to ``out/<name>/<name>.so``; seconds taken."""
    start, s = time.perf_counter(), spec(m)
    if s.name != name(m):
        raise ValueError(f"FlashInfer names the module {s.name}, not {name(m)}")
    s.build(verbose=False)
    dest = out / s.name / f"{s.name}.so"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(s.jit_library_path, dest)
    subprocess.run(["strip", "--strip-unneeded", str(dest)], check=False)
    return time.perf_counter() - start


def carried(out: Path, budget_mb: float, draws: int, seed: int) -> list[str]:
    """The modules of ``out`` to carry within ``budget_mb``: those the plan does not know first (a GPU
    machine compiled them for a reason the plan does not model), then by compile seconds saved per MB,
    each MB its xz'd size (their GPU code is compressed already: about 1.2 MB a batch module)."""
    shares = {name(m): (share, m) for m, share in plan(draws, seed)}
    sizes = {d.name: len(lzma.compress(f.read_bytes(), preset=6))
             for d in sorted(out.iterdir()) for f in d.glob("*.so")}
    def per_mb(n: str) -> float:
        if n not in shares:
            return math.inf
        share, m = shares[n]
        return share * DEVICE_S[m.backend] / sizes[n]
    kept, used = [], 0
    for n in sorted(sizes, key=per_mb, reverse=True):
        if used + sizes[n] <= budget_mb * 1e6:
            kept.append(n)
            used += sizes[n]
    return kept


def covered(names: set[str], draws: int, seed: int) -> float:
    """The share of the distribution's problems whose modules are all in ``names`` (no compile)."""
    rng = random.Random(seed)
    return sum(all(name(m) in names for m in needed(draw_one(rng, "cuda"))) for _ in range(draws)) / draws


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.offline.prebuild_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".offline-modules"), help="the store of built modules")
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0, help="the draws' seed (which modules, not a sweep)")
    ap.add_argument("--minutes", type=float, default=60.0, help="start no build after this long")
    ap.add_argument("--plan", action="store_true", help="print the order, build nothing")
    ap.add_argument("--carry-mb", type=float, help="print the names of the modules of --out to carry, build nothing")
    args = ap.parse_args()
    if args.carry_mb is not None:
        kept = carried(args.out, args.carry_mb, args.draws, args.seed)
        print("\n".join(kept))
        print(f"prebuild_kernels: {len(kept)} modules; every module a problem needs is among them for "
              f"{covered(set(kept), args.draws, args.seed + 1):.0%} of problems", file=sys.stderr)
        return
    start = time.perf_counter()
    for m, share in plan(args.draws, args.seed):
        have = (args.out / name(m) / f"{name(m)}.so").exists()
        if args.plan or have:
            print(f"{share:6.2%} {'have ' if have else ''}{name(m)}", flush=True)
            continue
        if time.perf_counter() - start > args.minutes * 60:
            break
        try:
            print(f"{share:6.2%} built in {build(m, args.out):.0f} s: {name(m)}", flush=True)
        except Exception as e:  # one module that fails to build leaves the rest to build
            print(f"{share:6.2%} FAILED {name(m)}: {str(e)[-300:]}", flush=True)


if __name__ == "__main__":
    main()
