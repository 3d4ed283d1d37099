"""The cuDNN entry's padded LSE written by one Triton launch (backends/native/padded_lse.py): the
packed (total_q, Hq) LSE by request into (B, max_q, Hq), rows past a request's length -inf.

On the CPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET); on the GPU
host on CUDA tensors, compiled. The expected values are indexed out of the packed tensor row by row
in Python, not computed by either implementation.
"""
from __future__ import annotations

import pytest
import torch

from backends.native import padded_lse
from dispatch import checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _expected(packed: torch.Tensor, lens: list[int], max_q: int) -> torch.Tensor:
    want = torch.full((len(lens), max_q, packed.shape[1]), float("-inf"), dtype=torch.float32)
    start = 0
    for b, n in enumerate(lens):
        want[b, :n] = packed[start:start + n].cpu()
        start += n
    return want


def _case(lens: list[int], heads: int, max_q: int, index_dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randn(sum(lens), heads, generator=gen).to(DEVICE)
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=index_dtype, device=DEVICE)
    padded = torch.full((len(lens), max_q, heads), float("nan"), device=DEVICE)  # poisoned: every element written
    return packed, indptr, padded


@pytest.mark.native_triton
@pytest.mark.parametrize("lens,heads,max_q", [([3, 1, 5], 4, 5), ([0, 7, 2, 0], 3, 9), ([1] * 6, 1, 4),
                                              ([300, 17, 64], 8, 311), ([1100], 2, 1100)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_one_launch_fills_rows_by_request_and_minus_inf_past_them(lens, heads, max_q, index_dtype):
    packed, indptr, padded = _case(lens, heads, max_q, index_dtype, seed=len(lens) * 31 + heads)
    before = packed.clone()
    assert padded_lse.write(packed, indptr, padded)
    assert torch.equal(padded.cpu(), _expected(packed, lens, max_q))
    assert torch.equal(packed, before)  # the packed LSE is read only


@pytest.mark.native_triton
def test_the_entrys_scatter_gives_the_same_rows_either_way():
    """scatter_padded_lse: the kernel on a GPU, PyTorch's ops on the CPU; both give the expected rows."""
    lens, heads, max_q = [4, 0, 9, 1], 5, 12
    packed, indptr, padded = _case(lens, heads, max_q, torch.int32, seed=7)
    checks.scatter_padded_lse(packed, indptr, padded)
    assert torch.equal(padded.cpu(), _expected(packed, lens, max_q))
    cpu = torch.full((len(lens), max_q, heads), float("nan"))
    checks.scatter_padded_lse(packed.cpu(), indptr.cpu(), cpu)
    assert torch.equal(cpu, _expected(packed, lens, max_q))


@pytest.mark.parametrize("what", ["strided padded", "half packed", "float indptr"])
def test_tensors_the_kernel_does_not_serve_are_left_to_the_caller(what):
    lens, heads, max_q = [2, 3], 4, 6
    packed, indptr, padded = _case(lens, heads, max_q, torch.int32, seed=3)
    if what == "strided padded":
        padded = torch.full((len(lens), heads, max_q), float("nan"), device=DEVICE).transpose(1, 2)
    elif what == "half packed":
        packed = packed.half()
    else:
        indptr = indptr.float()
    assert not padded_lse.write(packed, indptr, padded)
    assert padded.isnan().all()  # nothing written: the PyTorch scatter serves it


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU tensors without the interpreter: a CPU-only case")
def test_without_a_gpu_or_the_interpreter_nothing_launches(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    packed, indptr, padded = _case([2, 1], 2, 3, torch.int32, seed=5)
    assert not padded_lse.write(packed, indptr, padded) and padded.isnan().all()


@pytest.mark.native_triton
@pytest.mark.parametrize("backend", ["native-triton", "reference"])
def test_cudnn_entry_prefill_lse_against_fp64(monkeypatch, backend):
    """A prefill-shaped call through the entry as the seed spells it: every backend but cuDNN writes
    the packed LSE, and on a GPU the one launch pads it (counted); out and LSE against fp64."""
    import dispatch
    from dispatch.benchmark import cases
    from oracle import batch_attention_fp64, relative_error

    launched = []
    write = padded_lse.write
    monkeypatch.setattr(padded_lse, "write", lambda *a: launched.append(write(*a)) or launched[-1])
    monkeypatch.setattr(checks, "_PADDED_WRITE", [padded_lse.write])
    dtype, tol = (torch.bfloat16, 1e-2) if DEVICE == "cuda" else (torch.float32, 1e-5)
    q_lens, kv_lens = (3, 1, 6), (9, 4, 13)
    c = cases.paged(q_lens=q_lens, kv_lens=kv_lens, dtype=dtype, device=DEVICE)
    args, kw = cases.cudnn_args(c, return_lse=True)
    with dispatch.use_backend(backend):
        out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert dispatch.last_decision().ran == backend and lse.shape == (3, kw["max_token_per_sequence"], cases.HQ)
    assert launched == ([True] if DEVICE == "cuda" else [])
    k, v = c["cache"][:, 0].double().cpu(), c["cache"][:, 1].double().cpu()
    table, hkv, d = c["table"].long().cpu(), cases.HKV, cases.D
    ks = [k[table[b]].reshape(-1, hkv, d)[:n] for b, n in enumerate(kv_lens)]
    vs = [v[table[b]].reshape(-1, hkv, d)[:n] for b, n in enumerate(kv_lens)]
    want_out, want_lse = batch_attention_fp64(list(c["q"].double().cpu().split(list(q_lens))), ks, vs,
                                              sm_scale=d ** -0.5, causal=kw["causal"])
    assert relative_error(out.double().cpu(), want_out) < tol
    start = 0
    for b, n in enumerate(q_lens):
        assert relative_error(lse[b, :n].double().cpu(), want_lse[start:start + n]) < tol
        assert lse[b, n:].isneginf().all()
        start += n


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA-graph capture needs a GPU")
def test_capture_pads_with_the_kernel_once_compiled_and_replays_new_values():
    """Under capture only a compiled variant launches (else PyTorch's ops are captured); either way
    a replay pads the packed rows the replayed kernel wrote, new values included."""
    lens, heads, max_q = [5, 2, 0], 4, 7
    packed, indptr, padded = _case(lens, heads, max_q, torch.int32, seed=11)
    side = torch.cuda.Stream()
    for warm in (False, True):
        if warm:
            assert padded_lse.write(packed, indptr, padded)  # compiles the variant outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            checks.scatter_padded_lse(packed, indptr, padded)
        packed.copy_(torch.randn_like(packed))
        padded.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(padded.cpu(), _expected(packed, lens, max_q))
