"""Where torch.compile's CUDA graphs (mode="reduce-overhead") let a custom op keep a tensor it made on its
first call (a GPU machine).

    python -m tools.check_graph_pool

A kept tensor made inside the graphs' warm-up is refused afterwards ("tensors in the cudagraph pool not
tracked as outputs"), which is what ``single_prefill_with_kv_cache`` in a compiled custom op met while
our caches (index ranges, FlashInfer's single-prefill buffer, native plans' buffers) allocated on its
first call; they now make what they keep through ``backends._device.made_to_keep``, the way this check
found. torch's CUDA-graph trees route every allocation of the warm-up's *thread* to their pool
(torch/_inductor/cudagraph_trees.py ``_use_cuda_memory_pool_manager``:
``_cuda_beginAllocateCurrentThreadToPool``), so moving the allocation to another stream does not escape
it. One process per way of allocating the kept tensor: as it is, on another thread, and inside a
``torch.cuda.MemPool`` of its own (whether a pool entered later takes precedence); each prints whether
its first call ran on the default stream and inside a capture, then whether the compiled function ran
(OK) or was refused (FAILED).
"""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r'''
import sys
import threading
import torch

KEPT = []
mode = sys.argv[1]
name = "op_" + mode.replace("-", "_")  # an op's name takes no hyphen
torch.library.define(f"graph_pool_check::{name}", "(Tensor q) -> Tensor")


@torch.library.impl(f"graph_pool_check::{name}", "cuda")
def _impl(q):
    if not KEPT:
        print(mode, "first call: on the default stream:", torch.cuda.current_stream() == torch.cuda.default_stream(),
              "capturing:", torch.cuda.is_current_stream_capturing(), flush=True)
        if mode == "as-is":
            KEPT.append(torch.empty(1 << 20, device="cuda"))
        elif mode == "other-thread":
            worker = threading.Thread(target=lambda: KEPT.append(torch.empty(1 << 20, device="cuda")))
            worker.start()
            worker.join()
        else:
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                KEPT.append(torch.empty(1 << 20, device="cuda"))
            KEPT.append(pool)
    return q * 2


@torch.library.register_fake(f"graph_pool_check::{name}")
def _fake(q):
    return torch.empty_like(q)


op = getattr(torch.ops.graph_pool_check, name)
compiled = torch.compile(lambda q: op(q), mode="reduce-overhead", fullgraph=True)
try:
    for _ in range(3):
        compiled(torch.randn(8, device="cuda"))
    torch.cuda.synchronize()
    print(mode, "OK", flush=True)
except Exception as exc:  # noqa: BLE001 - the refusal is the finding
    print(mode, "FAILED:", str(exc).splitlines()[0][:160], flush=True)
'''


def main() -> int:
    for mode in ("as-is", "other-thread", "mem-pool"):
        done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith(mode)]
        print("\n".join(lines) or f"{mode}: no output (rc {done.returncode}): {done.stderr[-300:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
