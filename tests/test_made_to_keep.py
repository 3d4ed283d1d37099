"""Tensors a cache keeps past the call (backends._device.made_to_keep), made where no CUDA-graph pool
claims them: torch.compile's CUDA graphs route a warming thread's allocations into their pool and
refuse a warm-up that leaves a tensor there they do not own."""
from __future__ import annotations

import pytest
import torch

from backends import made_to_keep

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_on_the_cpu_it_is_made_here():
    made = made_to_keep(lambda: (torch.arange(5), None), torch.device("cpu"))
    assert torch.equal(made[0], torch.arange(5)) and made[1] is None


def _in_pool(pool, t: torch.Tensor) -> bool:
    return any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in pool.snapshot())


@GPU
def test_under_a_side_streams_pool_routing_it_is_made_outside_the_pool():
    """As torch.compile's warm-up routes it: a side stream, this thread's allocations to a pool."""
    device = torch.device("cuda", torch.cuda.current_device())
    pool, side = torch.cuda.MemPool(), torch.cuda.Stream()
    with torch.cuda.stream(side), torch.cuda.use_mem_pool(pool):
        routed = torch.arange(1 << 16, device=device)  # what an allocation made here does
        kept = made_to_keep(lambda: torch.arange(1 << 16, device=device), device)
        twice = kept * 2  # the side stream reads it after it was made
    torch.cuda.synchronize()
    assert _in_pool(pool, routed)  # the routing is real: the check below can fail
    assert not _in_pool(pool, kept)
    assert torch.equal(twice.cpu(), torch.arange(1 << 16) * 2)
