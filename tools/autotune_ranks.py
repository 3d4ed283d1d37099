"""Ranks agree on the autotune's choice: two GPUs, NCCL, under torchrun.

    torchrun --nproc_per_node=2 tools/autotune_ranks.py [--shapes FILE]

Every rank decides the same shapes (``attn-dispatch tune --shapes``' format; default ``SHAPES``) twice,
each time inside ``dispatch.autotune(True, cache=...)`` with a cache of its own that starts empty:

1. alone (``dispatch.autotune.set_process_group`` on a group of its own rank): each rank times the
   candidates on its own GPU, as ranks did before they agreed: the choices may differ;
2. together (the default group): rank 0's times are broadcast, every rank adopts them.

Rank 0 prints each rank's choices of both runs; the exit status is 1 when the ranks chose differently
together (alone, a difference is reported, not an error: it is what the agreement prevents). On a
machine without GPUs the same runs use gloo on the CPU (one candidate there: nothing to disagree on).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import dispatch
from dispatch import autotune, tune

SHAPES = """\
--phase decode --heads 32/8 --head-dim 128 --sizes 8 1 4096
--phase decode --heads 32/8 --head-dim 128 --sizes 64 1 1024 --cuda-graph
--phase decode --heads 32/8 --head-dim 128 --kv-dtype fp8 --sizes 32 1 2048
--phase decode --heads 32/8 --head-dim 128 --entry xqa_batch_decode_with_kv_cache --sizes 4 1 4096
--phase prefill --causal --heads 32/8 --head-dim 128 --sizes 2 512 512
--phase prefill --causal --heads 32/8 --head-dim 128 --entry cudnn_batch_prefill_with_kv_cache --sizes 4 256 1024
"""


def decide_all(shapes: Path, folder: str) -> list[dict]:
    """The shapes decided inside a tuning context whose cache (a new file in ``folder``) starts empty."""
    return tune.tune_shapes(shapes, Path(tempfile.mkdtemp(dir=folder)) / "autotune.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=Path, help="one shape a line, as attn-dispatch tune --shapes reads them")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ[autotune.ENV_AUTOTUNE] = "0"  # the default file is neither read nor written: each run starts empty
    folder = tempfile.mkdtemp(prefix=f"attn-dispatch-rank{rank}-")
    shapes = args.shapes or Path(folder) / "shapes.txt"
    if args.shapes is None:
        shapes.write_text(SHAPES)
    alone_groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    dispatch.autotune.set_process_group(alone_groups[rank])
    alone = decide_all(shapes, folder)
    dispatch.autotune.set_process_group(None)
    together = decide_all(shapes, folder)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "device": torch.cuda.get_device_name() if cuda else "cpu",
                                      "alone": alone, "together": together})
    picks = [[row["chosen"] for row in g["together"]] for g in gathered]
    agree = all(p == picks[0] for p in picks)
    if rank == 0:
        report(gathered, agree)
    dist.barrier()  # every rank done before any tears the group down
    dist.destroy_process_group()
    return 0 if agree else 1


def report(gathered: list[dict], agree: bool) -> None:
    for run in ("alone", "together"):
        print(f"{run}:")
        for i, row in enumerate(gathered[0][run]):
            picks = [g[run][i]["chosen"] for g in gathered]
            same = "same" if len(set(picks)) == 1 else "DIFFERENT"
            print(f"  {same:9s} " + "  ".join(f"rank {g['rank']} {g[run][i]['chosen']:13s}" for g in gathered)
                  + f"  {row['shape']}")
    print("devices: " + ", ".join(f"rank {g['rank']} {g['device']}" for g in gathered))
    print(f"together, every rank chose the same backend: {agree}")


if __name__ == "__main__":
    sys.exit(main())
