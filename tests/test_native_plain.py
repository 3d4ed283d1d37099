"""The plain-path kernel (backends/native/triton_plain.py) and its variants against the fp64 oracle.

Runs under the interpreter on a CPU (tests/conftest.py), TMA descriptors included, on small tiles
(16 x 16, so interior, diagonal and ragged-end tiles all occur) with every candidate switch: paged
gather or ragged/dense K/V by TMA or pointers, persistent or one program per query block. On a GPU
host the same file runs compiled.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backends.native import triton_backend as tb
from backends.native.triton_backend import TileConfig
from dispatch.benchmark.native import BACKEND, DEVICE, Case, build, problem_of, run_case
from dispatch.problem import AttentionBatch

CASES = {
    "ragged_causal_gqa4_bf16": Case(storage="ragged", hq=8, hkv=2, dtype="bfloat16", q_lens=(20, 5, 1),
                                    kv_lens=(40, 37, 16)),
    "ragged_noncausal_q_gt_kv": Case(storage="ragged", causal=False, q_lens=(9, 17), kv_lens=(3, 50)),
    "ragged_causal_fully_masked_rows": Case(storage="ragged", q_lens=(6, 2), kv_lens=(3, 7)),
    "dense_causal_d128": Case(storage="dense", q_lens=(18,), kv_lens=(33,), dqk=128, dvo=128, hq=2, hkv=1),
    "paged16_causal_gqa4": Case(page_size=16, hq=8, hkv=2, q_lens=(21, 4), kv_lens=(50, 33)),
    "paged_hnd_page5_bf16": Case(layout="HND", page_size=5, dtype="bfloat16", q_lens=(7, 12), kv_lens=(30, 12)),
    "tensor_scales_strided_q_out_no_lse": Case(storage="ragged", tensor_scales=True, strided_q=True, lse=False,
                                               q_lens=(5, 19), kv_lens=(24, 40)),
    # RoPE rotated inside the kernel (q at its positions, each K tile's halves at the keys')
    "rope_ragged_causal_gqa4_bf16": Case(storage="ragged", hq=8, hkv=2, dtype="bfloat16", pos="ROPE_LLAMA",
                                         q_lens=(20, 5, 1), kv_lens=(40, 37, 16)),
    "rope_paged16_causal_gqa4": Case(page_size=16, hq=8, hkv=2, pos="ROPE_LLAMA", q_lens=(21, 4), kv_lens=(50, 33)),
    "rope_paged_hnd_page5_noncausal": Case(layout="HND", page_size=5, dtype="bfloat16", causal=False,
                                           pos="ROPE_LLAMA", q_lens=(7, 12), kv_lens=(30, 12)),
}
SWITCHES = {"pointer": {}, "tma": dict(kv_tma=True), "persistent": dict(persistent=True),
            "tma_persistent": dict(kv_tma=True, persistent=True)}


def _config(c: Case, **switches) -> TileConfig:
    return TileConfig(16, 16, 2 if c.hq // c.hkv % 2 == 0 else 1, num_warps=4, num_stages=1, kernel="plain",
                      **switches)


@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("name", list(CASES))
def test_plain_kernel_matches_fp64(name, switch):
    c = CASES[name]
    switches = SWITCHES[switch]
    if c.storage == "paged" and switches.get("kv_tma"):
        pytest.skip("paged K/V take the per-key gather (no TMA row gather on Hopper)")
    plan, _, _ = run_case(c, config=_config(c, **switches))
    assert plan.attention.kernel.fn.__name__ == "_attn_fwd_plain"
    assert (plan.pointer_attention is not None) == bool(switches.get("kv_tma"))
    if switches.get("persistent"):  # about one wave of programs take every tile in turn
        device = torch.device(DEVICE)
        wave = (tb._sm_count(device) * tb.programs_per_sm(plan.problem, plan.config, device)
                if device.type == "cuda" else 3)  # the interpreter: 3, so each program takes several tiles
        assert plan.grid[1:] == (1, 1) and 1 <= plan.grid[0] <= wave


def _ragged_batch(c: Case, k_width: int):
    """A batch whose K is a column slice (heads not packed in a row when k_width > head dim)."""
    kw, dense_k, dense_v = build(c)
    wide = torch.zeros((kw["k"].shape[0], c.hkv, k_width), dtype=kw["k"].dtype, device=DEVICE)
    wide[..., : c.dqk] = kw["k"]
    kw["k"] = wide[..., : c.dqk]
    out = torch.full((sum(c.q_lens), c.hq, c.dvo), float("nan"), dtype=torch.float16, device=DEVICE)
    lse = torch.full((sum(c.q_lens), c.hq), float("nan"), device=DEVICE)
    return AttentionBatch(out=out, lse=lse, sm_scale=0.2, out_scale=1.0, **kw), dense_k, dense_v


def test_tma_plan_takes_the_pointer_twin_when_k_is_not_tma_ready(monkeypatch):
    """K whose heads are not packed in a row cannot be read through the (rows, heads x dim) descriptor:
    run (and the launcher) take the plan's pointer twin, and the answer still matches (the TMA kernel
    would read the wrong columns)."""
    import oracle

    c = CASES["ragged_causal_gqa4_bf16"]
    c = replace(c, dtype="float16")
    batch, dense_k, dense_v = _ragged_batch(c, c.dqk + 16)
    plan = BACKEND.plan(problem_of(c), batch, config=_config(c, kv_tma=True))
    assert not tb._tma_ready(plan, batch)
    calls = []
    for launch in (plan.attention, plan.pointer_attention):
        monkeypatch.setattr(launch, "kernel", _Recording(launch.kernel, calls, launch is plan.attention))
    launcher = BACKEND.launcher(plan, batch)
    for call in (lambda: BACKEND.run(plan, batch), lambda: launcher(batch)):
        batch.out.fill_(float("nan"))
        call()
        starts = [0, *torch.tensor(c.q_lens).cumsum(0).tolist()]
        ref_out, _ = oracle.batch_attention_fp64([batch.q[a:b] for a, b in zip(starts[:-1], starts[1:])],
                                                 dense_k, dense_v, sm_scale=0.2, causal=True)
        assert (batch.out.double() - ref_out).abs().max() < 1e-2
    # run launched the pointer twin; the launcher's compiled call (on a GPU) bypasses kernel[grid], so
    # there only its answer above says it did not take the TMA kernel
    assert calls[0] == "pointer" and "tma" not in calls


class _Recording:
    """A kernel stand-in that records which twin launched, then launches the real kernel."""

    def __init__(self, kernel, calls: list, is_tma: bool):
        self.kernel, self.calls, self.is_tma = kernel, calls, is_tma

    def __getitem__(self, grid):
        self.calls.append("tma" if self.is_tma else "pointer")
        return self.kernel[grid]


def test_plain_config_refuses_what_it_cannot_serve():
    with pytest.raises(ValueError, match="soft_cap"):
        BACKEND.plan(problem_of(Case(soft_cap=2.0)), _batch(Case()), config=TileConfig(16, 16, 1, 4, 1, "plain"))
    with pytest.raises(ValueError, match="kv_tma with paged"):
        BACKEND.plan(problem_of(Case()), _batch(Case()), config=TileConfig(16, 16, 1, 4, 1, "plain", kv_tma=True))
    with pytest.raises(ValueError, match="kernel='plain'"):
        BACKEND.plan(problem_of(Case()), _batch(Case()), config=TileConfig(16, 16, 1, 4, 1, persistent=True))


def _batch(c: Case) -> AttentionBatch:
    kw, _, _ = build(c)
    out = torch.empty((sum(c.q_lens), c.hq, c.dvo), dtype=torch.float16, device=DEVICE)
    return AttentionBatch(out=out, **kw)


def test_plain_prefill_switch_serves_large_paged_prefill_tiles(monkeypatch):
    """PLAIN_PREFILL (triton_backend.py) is the one-line switch: by default the large prefill tiles of
    paged problems plain_reasons accepts plan on the plain kernel with 4 stages (measured best on the
    H100), ragged ones and small tiles keep the general kernel; set otherwise, it applies as set
    (kv_tma dropped for paged K/V)."""
    cuda = torch.device("cuda", 0)
    ragged = problem_of(Case(storage="ragged", dtype="bfloat16", hq=32, hkv=8, dqk=128, dvo=128))
    paged = replace(ragged, kv_storage="paged", page_size=16)
    assert tb.choose_config(ragged, 2048, cuda).kernel == "general"
    assert tb.choose_config(paged, 2048, cuda) == TileConfig(256, 64, 4, 8, 4, "plain")
    assert tb.choose_config(paged, 4, cuda).kernel == "general"  # a decode-like tile
    rope = replace(paged, pos_encoding="ROPE_LLAMA")
    assert tb.choose_config(rope, 2048, cuda) == TileConfig(256, 64, 4, 8, 3, "plain")
    monkeypatch.setattr(tb, "PLAIN_PREFILL_STORAGE", ("paged", "ragged"))
    monkeypatch.setattr(tb, "PLAIN_PREFILL", dict(kernel="plain", kv_tma=True, persistent=True))
    assert tb.choose_config(ragged, 2048, cuda) == TileConfig(256, 64, 4, 8, 3, "plain", True, True)
    assert tb.choose_config(paged, 2048, cuda) == TileConfig(256, 64, 4, 8, 3, "plain", False, True)
    assert tb.choose_config(replace(ragged, logits_soft_cap=5.0), 2048, cuda).kernel == "general"
    assert tb.choose_config(replace(ragged, phase="decode"), 1, cuda).kernel == "general"


def test_an_underfilled_plain_grid_takes_the_general_kernel_which_splits_the_keys(monkeypatch):
    """The plain kernel has no KV split: with fewer programs than half the SMs (few requests x KV heads
    x query blocks) and keys the general kernel would split, that kernel serves (H200: 24 programs,
    5.55 -> 0.59 ms at 120k keys); a filled grid, keys too short to split, splits shorter than the
    general tile's query rows, or the CPU keep the plain one."""
    from types import SimpleNamespace
    cuda = torch.device("cuda", 0)
    assert tb.UNDERFILLED_SHARE == 0.5  # on by default since timed on the H200
    monkeypatch.setattr(tb, "_sm_count", lambda device: 132)
    monkeypatch.setattr(tb, "_smem_limit", lambda device: 0.9 * 227 * 1024)
    monkeypatch.setattr(tb, "fit_shared_memory", lambda problem, cfg, device: cfg)
    paged = problem_of(Case(dtype="bfloat16", hq=4, hkv=1, dqk=128, dvo=128, page_size=16))

    def pick(batch: int, q: int, kv: int, device=cuda) -> TileConfig:
        cfg = tb.choose_config(paged, q, device)
        assert cfg.kernel == "plain"
        blocks = -(-q * cfg.heads_per_program // cfg.block_m)
        facts = SimpleNamespace(batch_size=batch, max_q_len=q, max_kv_len=kv)
        got, got_blocks = tb.split_when_underfilled(paged, facts, cfg, blocks, device)
        assert got_blocks == -(-q * got.heads_per_program // got.block_m)
        return got

    assert pick(2, 331, 120436).kernel == "general"  # 2 x 1 x 4 x 3 = 24 programs
    assert pick(2, 331, 120436, torch.device("cpu")).kernel == "plain"
    assert pick(2, 331, 64).kernel == "plain"  # one key tile: nothing to split
    assert pick(8, 331, 120436).kernel == "plain"  # 96 programs: at least half a wave
    assert pick(1, 2048, 120436).kernel == "general"  # 32 blocks of 256 rows (4 heads x 64 queries): 32 programs
    assert pick(1, 1483, 1483).kernel == "plain"  # 24 programs, but splits of fewer keys than 256 rows
    monkeypatch.setattr(tb, "UNDERFILLED_SHARE", 0.0)
    assert pick(2, 331, 120436).kernel == "plain"  # 0.0 turns the switch off
