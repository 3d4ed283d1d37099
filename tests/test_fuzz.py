"""Random VALID calls of the seven entry points against the fp64 oracle.

Configurations come from tests/_fuzz_setups.py (rendered by tests/scenarios.py: fresh random
inputs, NaN-poisoned out/lse buffers where the call takes them). Each configuration has its
own fixed seed (entry, backend, index), so a failure reproduces from the id it prints. About
half of the configurations are "siblings" of the previous one (same shapes, another head count,
head dim, KV length or layout) run right after it in the same process, without clearing any
cache: a cache keyed on too little answers them wrongly or crashes. Counts: REF_PER_ENTRY per
entry on the reference backend, NATIVE_PER_ENTRY on native-triton (Triton interpreter on CPU).
"""
from __future__ import annotations

import random
import zlib

import pytest
import torch

import dispatch
from _calls import make, same_bits
from _fuzz_setups import dtype_for, random_setup, sibling
from oracle import attention_fp64, packbits_little
from scenarios import ENTRIES, build
from test_agreement import check_lse, check_out

REF_PER_ENTRY = 300
NATIVE_PER_ENTRY = 40
GROUP = 100


def configurations(entry: str, backend: str, count: int):
    """[(id, setup, dtype, seed)]: every other one a sibling of its predecessor."""
    rng = random.Random(zlib.crc32(f"{entry}-{backend}".encode()))
    out, prev = [], None
    for i in range(count):
        if prev is not None and rng.random() < 0.5:
            setup, dtype = sibling(entry, prev[0], rng), prev[1]
        else:
            dtype = dtype_for(entry, rng)
            setup = random_setup(entry, rng, dtype)
        prev = (setup, dtype)
        out.append((f"{entry}/{backend}/#{i}", setup, dtype, zlib.crc32(f"{entry}-{backend}-{i}".encode())))
    return out


def run_one(entry: str, backend: str, setup, dtype: str, seed: int) -> None:
    case = build(entry, setup, dtype, seed)
    before = {name: t.detach().clone() for name, t in case.inputs.items()}
    with dispatch.use_backend(backend):
        result = case.call()
    moved = [name for name, t in case.inputs.items() if not same_bits(t, before[name])]
    assert not moved, f"the call modified its inputs: {moved}"
    for name, buf in case.zero_buffers.items():
        assert int(torch.count_nonzero(buf)) == 0, f"{name} must stay zero"
    out, lse = case.unpack(result)
    check_out(case, out)
    check_lse(case, lse)


def run_group(configs, backend: str) -> None:
    failures = []
    for cid, setup, dtype, seed in configs:
        try:
            run_one(setup_entry(cid), backend, setup, dtype, seed)
        except Exception as exc:  # collected: the message names every failing configuration
            failures.append(f"{cid} seed={seed} dtype={dtype} {setup}: {type(exc).__name__}: {exc}")
    assert not failures, f"{len(failures)} of {len(configs)} failed:\n" + "\n".join(failures[:6])


def setup_entry(cid: str) -> str:
    return cid.split("/")[0]


def _groups(backend: str, per_entry: int, marks=()):
    params = []
    for entry in ENTRIES:
        configs = configurations(entry, backend, per_entry)
        for start in range(0, per_entry, GROUP):
            params.append(pytest.param(configs[start:start + GROUP], backend, marks=list(marks),
                                       id=f"{backend}-{entry}-{start}-{min(start + GROUP, per_entry) - 1}"))
    return params


@pytest.mark.parametrize("configs, backend", _groups("reference", REF_PER_ENTRY)
                         + _groups("native-triton", NATIVE_PER_ENTRY, [pytest.mark.native_triton]))
def test_fuzz(configs, backend):
    run_group(configs, backend)


def test_fuzz_counts():
    assert len(ENTRIES) * REF_PER_ENTRY >= 2000 and len(ENTRIES) * NATIVE_PER_ENTRY >= 200
    configs = configurations("paged", "reference", REF_PER_ENTRY)
    siblings = sum(1 for a, b in zip(configs, configs[1:]) if a[1] != b[1] and a[2] == b[2]
                   and (a[1].q_lens == b[1].q_lens))
    assert siblings >= REF_PER_ENTRY // 4, f"only {siblings} siblings"


# -- the reproducers and the documented alternative forms --------------------------------------------
@pytest.mark.parametrize("backend", ["reference", pytest.param("native-triton", marks=pytest.mark.native_triton)])
def test_single_gqa_and_head_dim_siblings(backend):
    """q (5,8,64) fp16 with k/v (7,2,64), then k/v (7,4,64) (8/4 heads: valid), then v head dim
    64 then 48: every call right after the other, each checked against the oracle."""
    for i, (hkv, dvo) in enumerate([(2, None), (4, None), (4, 64), (4, 48)]):
        call = make("single", seed=100 + i, q_lens=(5,), kv_lens=(7,), hq=8, hkv=hkv, d=64, dvo=dvo,
                    dtype=torch.float16)
        with dispatch.use_backend(backend):
            call.check(call.invoke())


@pytest.mark.parametrize("entry", ["trtllm", "xqa"])
def test_uint32_seq_lens(entry):
    call = make(entry, seed=5)
    pos = 4  # seq_lens
    call.args[pos] = call.args[pos].to(torch.uint32)
    call.check(call.invoke())


@pytest.mark.parametrize("entry", ["trtllm", "xqa"])
def test_sinks_forms(entry):
    """A tensor, a list of floats and a list of one tensor give the same result."""
    sinks = torch.rand(4, generator=torch.Generator().manual_seed(1)) * 5
    results = []
    for form in (sinks, sinks.tolist(), [sinks]):
        call = make(entry, seed=6)
        call.kw["sinks"] = form
        out = call.invoke()
        results.append(out[0] if isinstance(out, tuple) else out)
    assert not torch.isnan(results[0]).any()
    assert all(torch.equal(results[0], r) for r in results[1:])


def _single_masked(seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(4, 4, 16, generator=g), torch.randn(6, 2, 16, generator=g), torch.randn(6, 2, 16, generator=g)
    return q, k, v, torch.rand(4, 6, generator=g) < 0.6, torch.rand(4, 6, generator=g) < 0.6


def test_single_custom_mask_flattened():
    q, k, v, mask, _ = _single_masked(1)
    out = dispatch.single_prefill_with_kv_cache(q, k, v, custom_mask=mask.reshape(-1))
    ref, _ = attention_fp64(q, k, v, sm_scale=0.25, mask=mask)
    assert (out.double() - ref).abs().max() < 1e-5


def test_single_packed_mask_wins():
    q, k, v, ignored, used = _single_masked(2)
    out = dispatch.single_prefill_with_kv_cache(q, k, v, custom_mask=ignored,
                                               packed_custom_mask=packbits_little(used.reshape(-1)))
    ref, _ = attention_fp64(q, k, v, sm_scale=0.25, mask=used)
    assert (out.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("lens_shape", ["(B,1,1,1)", "(B,)"])
def test_cudnn_batch_without_offsets(lens_shape):
    """B > 1 without batch_offsets_*: packed rows, offsets derived from the lengths."""
    call = make("cudnn", seed=8)
    for name in ("batch_offsets_q", "batch_offsets_o"):
        call.kw.pop(name)
    if lens_shape == "(B,)":
        for name in ("actual_seq_lens_q", "actual_seq_lens_kv"):
            call.kw[name] = call.kw[name].reshape(-1)
    call.check(call.invoke())
