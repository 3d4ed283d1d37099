"""Shared pieces of the tests that restate FlashInfer's own attention tests through ``dispatch``.

Each ``test_fi_semantics_<area>.py`` rewrites the cases of one FlashInfer test file: the same entry
points, parameter names, layouts and kinds, checked against the fp64 oracle (tests/oracle.py) with
FlashInfer's tolerances. A case runs on the CPU through ``auto`` (the reference serves it) with
small sizes, and on a GPU with a larger sample both through ``auto`` and through the backend
FlashInfer's test names. Where that backend needs other hardware, the case checks the refusal.
"""
from __future__ import annotations

import contextlib
import math
import os
import random

import pytest
import torch

import dispatch
from oracle import attention_fp64

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
WORKSPACE_BYTES = 1 << 16
# our Triton kernels run on the CPU through Triton's interpreter (slow): the smallest CPU case of
# each test runs through them too
CPU_KERNEL = "native-triton"
INTERPRETED = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton runs on CPU tensors only in its interpreter (TRITON_INTERPRET=1, "
                                        "set by conftest without a GPU)")
# the compute capabilities (major) each vendor-named backend's kernels are built for
HARDWARE = {"trtllm-gen": (10,), "fa3": (9,), "xqa": (9, 10, 12)}


def ident(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, (tuple, list)):
        return "x".join(ident(v) for v in value)
    return str(value)


def smallest(cases, keep=lambda case: True):
    """The smallest case (``case_size``) of those ``keep`` accepts, as a one-case list."""
    return sorted((c for c in cases if keep(c)), key=case_size)[:1]


def case_size(case) -> int:
    """The product of a case's integer values: a rough measure of its work."""
    size = 1
    for value in case:
        if isinstance(value, int) and not isinstance(value, bool):
            size *= max(abs(value), 1)
    return size


def grid(names: str, cpu_cases, gpu_cases=(), named=None, native=()):
    """pytest.mark.parametrize over ("device", "backend", *names): every CPU case through auto and the
    smallest (and the ``native`` cases: a kind the smallest lacks) through our Triton kernels; every GPU
    case through auto and through ``named`` (the backend or backends FlashInfer's test passes)."""
    fields = tuple(n.strip() for n in names.split(","))
    named = (named,) if isinstance(named, str) else tuple(named or ())
    params = [pytest.param("cpu", "auto", *c, id="cpu-auto-" + "-".join(ident(v) for v in c)) for c in cpu_cases]
    params += [pytest.param("cpu", CPU_KERNEL, *c, marks=INTERPRETED,
                            id=f"cpu-{CPU_KERNEL}-" + "-".join(ident(v) for v in c))
               for c in sorted(cpu_cases, key=case_size)[:1] + list(native)]
    for backend in ("auto",) + named:
        params += [pytest.param("cuda", backend, *c, marks=GPU, id=f"cuda-{backend}-" + "-".join(ident(v) for v in c))
                   for c in gpu_cases]
    return pytest.mark.parametrize(("device", "backend") + fields, params)


def sample(cases, count: int, seed: int = 0) -> list:
    """A fixed random sample of a parameter grid (a stride through the grid aliases its axes)."""
    cases = list(cases)
    return random.Random(seed).sample(cases, min(count, len(cases)))


def randn(*shape, dtype=torch.float16, device="cpu", seed=0, scale=1.0) -> torch.Tensor:
    """Seeded normal values drawn on the CPU (the same inputs on every device), stored in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def workspace(device) -> torch.Tensor:
    """The caller's workspace: FlashInfer's tests' 128 MiB on a GPU (a vendor backend may use it)."""
    return torch.empty(128 << 20 if str(device).startswith("cuda") else WORKSPACE_BYTES, dtype=torch.uint8,
                       device=device)


def indptr(lengths, device="cpu") -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(list(lengths)).cumsum(0).tolist(), dtype=torch.int32, device=device)



@contextlib.contextmanager
def forced(backend: str):
    """For entry points without a ``backend=`` argument: the backend chosen through use_backend."""
    if backend == "auto":
        yield
    else:
        with dispatch.use_backend(backend):
            yield


def needs_other_hardware(device: str, backend: str) -> bool:
    """True on a GPU whose compute capability the named backend's kernels are not built for."""
    wanted = HARDWARE.get(backend)
    return device == "cuda" and wanted is not None and torch.cuda.get_device_capability()[0] not in wanted


def expect_hardware_refusal(call) -> None:
    """The call is refused with an error that names the compute capability and what is allowed."""
    with pytest.raises(dispatch.BackendRefusedError) as err:
        call()
    text = str(err.value)
    assert "sm=" in text and "allowed" in text, text


def close(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> None:
    """FlashInfer's elementwise tolerance, against the fp64 oracle; every entry written (no NaN)."""
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert not torch.isnan(got).any(), "NaN in the output (an unwritten or poisoned element)"
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


def single_ref(q, k, v, **kw):
    """fp64 (out, lse base 2) of one request in NHD, computed on q's device."""
    sm_scale = kw.pop("sm_scale", None)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    return attention_fp64(q, k, v, sm_scale=sm_scale, **kw)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's head slopes as FlashInfer's tests' reference states them: the geometric series
    2^(-8/n)^i for the largest power of two n <= heads, then every other term of the series
    for 2n (the paper's rule for head counts that are not powers of two)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [(2.0 ** (-8.0 / n)) ** i for i in range(1, n + 1)]
    slopes += [(2.0 ** (-4.0 / n)) ** i for i in range(1, 1 + 2 * (num_heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


def paged_pool(kv_lens, page_size, num_kv_heads, head_dim, *, layout="NHD", dtype=torch.float16, device="cpu",
               seed=1, shuffle=True):
    """A 5-D (pages, 2, ...) cache in ``layout`` with each request's pages in a random order, and
    FlashInfer's page lists (indptr, indices, last_page_len) and each request's K/V in NHD."""
    pages_per = [max(1, -(-n // page_size)) for n in kv_lens]
    total = sum(pages_per)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(total, generator=g) if shuffle else torch.arange(total)
    nhd = torch.randn(total, 2, page_size, num_kv_heads, head_dim, generator=g).to(dtype)
    cache = nhd if layout == "NHD" else nhd.transpose(2, 3).contiguous()
    ks, vs, start = [], [], 0
    for n, pages in zip(kv_lens, pages_per):
        ids = perm[start:start + pages]
        ks.append(nhd[ids, 0].reshape(-1, num_kv_heads, head_dim)[:n].to(device))
        vs.append(nhd[ids, 1].reshape(-1, num_kv_heads, head_dim)[:n].to(device))
        start += pages
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    return dict(cache=cache.to(device), indptr=indptr(pages_per), indices=perm.to(torch.int32), last=last,
                ks=ks, vs=vs, pages_per=pages_per)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def nvfp4(shape, device="cpu", seed=3):
    """NVFP4 values as FlashInfer's tests draw them: ``shape`` (..., D / 2) packed fp4 e2m1 pairs
    (sign bits clear) and (..., D / 16) fp8 e4m3 scale bytes from {0.125, 0.25, 0.5, 1}; with the
    fp64 values they stand for (element 2i in the low nibble, times its 16-element block's scale)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) & 0x77
    choices = torch.tensor([56, 48, 40, 32], dtype=torch.uint8)
    sf = choices[torch.randint(0, 4, (*shape[:-1], shape[-1] // 8), generator=g)]
    low, high = E2M1[(packed & 0x7).long()], E2M1[(packed >> 4 & 0x7).long()]
    values = torch.stack([low, high], dim=-1).reshape(*shape[:-1], shape[-1] * 2)
    scale = sf.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=-1)
    return packed.to(device), sf.to(device), (values * scale).to(device)


def cudnn_paged_case(batch_size, s_qo, s_kv, page_size, num_kv_heads, num_qo_heads, head_dim, device, seed=1,
                     dtype=torch.bfloat16):
    """FlashInfer's cuDNN paged inputs: per-request lengths (q in [1, s_qo], kv in [s_qo, s_kv]) as
    (batch, 1, 1, 1) int32, a cache whose memory is NHD but whose K/V views are (pages, Hkv, page,
    D), one block-table row per request, the page lists, and each request's K and V in NHD."""
    g = torch.Generator().manual_seed(seed)
    seq_q = torch.randint(1, s_qo + 1, (batch_size,), generator=g, dtype=torch.int32)
    seq_kv = torch.randint(s_qo, s_kv + 1, (batch_size,), generator=g, dtype=torch.int32)
    per = -(-s_kv // page_size)
    nhd = torch.randn(batch_size * per, 2, page_size, num_kv_heads, head_dim, generator=g).to(dtype)
    k_cache, v_cache = nhd[:, 0].transpose(1, 2), nhd[:, 1].transpose(1, 2)
    table = torch.arange(batch_size * per, dtype=torch.int32).reshape(batch_size, per)
    pages = (seq_kv + page_size - 1) // page_size
    indices = torch.cat([table[b, :int(pages[b])] for b in range(batch_size)])
    last = torch.where(seq_kv % page_size == 0, torch.full_like(seq_kv, page_size), seq_kv % page_size)
    ks = [nhd[table[b].long(), 0].flatten(0, 1)[:int(n)].to(device) for b, n in enumerate(seq_kv)]
    vs = [nhd[table[b].long(), 1].flatten(0, 1)[:int(n)].to(device) for b, n in enumerate(seq_kv)]
    q = torch.randn(int(seq_q.sum()), num_qo_heads, head_dim, generator=g).to(dtype).to(device)
    return dict(q=q, k_cache=k_cache.to(device), v_cache=v_cache.to(device), block_tables=table.to(device),
                seq_q=seq_q, seq_kv=seq_kv, qo_indptr=indptr(seq_q.tolist()), kv_indptr=indptr(pages.tolist()),
                kv_indices=indices, last=last.to(torch.int32), ks=ks, vs=vs)


def per_request(out, q, q_lens, ks, vs, rtol, atol, lse=None, **kw):
    """Each request's rows of ``out`` (and of a token-major ``lse``) against the oracle."""
    start = 0
    for n, k, v in zip(q_lens, ks, vs):
        ref, ref_lse = single_ref(q[start:start + n], k, v, **kw)
        close(out[start:start + n], ref, rtol=rtol, atol=atol)
        if lse is not None:
            close(lse[start:start + n], ref_lse, rtol=rtol, atol=atol)
        start += n
