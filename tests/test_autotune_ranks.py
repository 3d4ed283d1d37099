"""Ranks agree: under torch.distributed (two CPU processes, gloo) every rank makes the autotune's
choice of rank 0, though each rank's own timings would choose differently; a failure of rank 0's
timing reaches every rank. The same check on two GPUs (NCCL): tools/autotune_ranks.py under torchrun."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch.multiprocessing as mp

# each rank's own timings: alone, rank 0 would choose native-triton and rank 1 the reference
OWN_MS = {0: {"reference": 5.0, "native-triton": 1.0}, 1: {"reference": 1.0, "native-triton": 5.0}}
BUCKETS = ((4, 1, 64), (8, 1, 64), (4, 16, 128))


def one_rank(rank: int, world: int, folder: str) -> None:
    """A rank's warm-up: three buckets decided inside the tuning context, with its own fake timings."""
    os.environ["ATTN_DISPATCH_CACHE_DIR"] = os.path.join(folder, f"cache-{rank}")
    import torch.distributed as dist

    import capability_db
    from dispatch import autotune, choice
    from dispatch.benchmark.vendors import make_problem

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        timed: list[str] = []

        def measure(problem, names, sizes, lengths=None):
            timed.extend(names)
            return {n: OWN_MS[rank][n] for n in names}
        autotune.measure = measure
        chosen = []
        with autotune.autotune(True):
            for sizes in BUCKETS:
                problem = make_problem(phase="decode" if sizes[1] == 1 else "prefill")
                ranking = choice.rank(problem, capability_db.CPU_DEVICE, ["reference", "native-triton"], sizes)
                chosen.append(ranking.order[0])
        autotune.measure = lambda problem, names, sizes, lengths=None: (_ for _ in ()).throw(ValueError("no room"))
        try:  # rank 0's timing fails: every rank raises, none waits for it
            with autotune.autotune(True):
                choice.rank(make_problem(phase="decode"), capability_db.CPU_DEVICE, ["reference", "native-triton"],
                            (32, 1, 64))
            failed = ""
        except Exception as exc:
            failed = f"{type(exc).__name__}: {exc}"
        Path(folder, f"rank-{rank}.json").write_text(json.dumps({"chosen": chosen, "timed": timed, "failed": failed}))
    finally:
        dist.barrier()  # both ranks done before either tears gloo down (a rank leaving first aborts the other)
        dist.destroy_process_group()


def test_every_rank_chooses_what_rank_0_timed(tmp_path):
    mp.spawn(one_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["chosen"] == ranks[1]["chosen"] == ["native-triton"] * len(BUCKETS)
    assert ranks[0]["timed"] and not ranks[1]["timed"]  # rank 0 timed, rank 1 adopted its times
    assert ranks[0]["failed"] == "ValueError: no room"
    assert ranks[1]["failed"].startswith("RuntimeError: attn_dispatch: the autotune on rank 0 failed")
    files = [json.loads(next((tmp_path / f"cache-{r}").glob("autotune-*.json")).read_text()) for r in range(2)]
    assert files[0]["buckets"] == files[1]["buckets"] and len(files[0]["buckets"]) == len(BUCKETS)
